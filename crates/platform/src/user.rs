//! Who we are, and whether a file is ours and private.
//!
//! Unix: the uid, a file's owner uid and mode bits. Windows: the user's SID (its last
//! sub-authority stands in as the number `status` shows), a file's owner SID from its
//! security descriptor; no mode bits (a file in the user's profile is private through its
//! inherited DACL).

use super::Error;
use std::fs::{DirBuilder, File, OpenOptions};
use std::path::Path;

/// Our uid (Windows: the relative id of our SID).
pub fn uid() -> u32 {
    imp::uid()
}

/// A dir builder that makes dirs only we may enter (0700 on Unix).
pub fn private_dir_builder() -> DirBuilder {
    let mut b = DirBuilder::new();
    imp::private_dir(&mut b);
    b
}

/// Open options for a file only we may read (0600 on Unix, at creation).
pub fn private_file_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    imp::private_file(&mut o);
    o
}

/// Writes `bytes` as the whole of the file at `path` in place (the same file, not a new one
/// renamed over it: for readers that take a rename for the file's going): created only ours
/// (0600) when missing, never written through a symlink.
pub fn write_private_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut o = private_file_options();
    o.write(true).create(true).truncate(true);
    imp::no_follow(&mut o);
    o.open(path)?.write_all(bytes)
}

/// Writes `bytes` as the whole of the file at `path`, only ours (0600; its dir made 0700 when
/// missing): a temporary file beside it renamed into place, so a reader or a crash sees the old
/// content or the new, never half; `sync` flushes file and dir to disk before returning.
pub fn replace_private(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    private_dir_builder().recursive(true).create(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        {
            // Closed before the rename: Windows renames no file that is open.
            let mut f = private_file_options()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            if sync {
                f.sync_all()?;
            }
        }
        std::fs::rename(&tmp, path)?;
        if sync {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A path's owner and permission bits where the platform has them (`None` on Windows).
pub fn owner_and_mode(meta: &std::fs::Metadata) -> Option<(u32, u32)> {
    imp::owner_and_mode(meta)
}

/// Sets `path`'s permission bits (Unix); nothing on Windows.
pub fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    imp::set_mode(path, mode)
}

/// A file's identity, to tell a replaced file or dir from the same one: (device, inode) on
/// Unix. On Windows only that it exists (`(0, 0)`): the file index is not in stable Rust, and
/// creation times move under wine with every write; a lock dir replaced there is still found
/// by the rescan.
pub fn file_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    imp::file_identity(meta)
}

/// Whether `meta` is an executable file (a mode bit on Unix; any file on Windows).
pub fn is_executable(meta: &std::fs::Metadata) -> bool {
    imp::is_executable(meta)
}

/// A symlink at `link` to `target` (Unix); Windows makes them only with a privilege a user
/// rarely holds, so there it is `Unsupported`, with what to do instead.
pub fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(target, link)
    }
    #[cfg(not(unix))]
    {
        let _ = (target, link);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "no command link on Windows; add the binary's folder to PATH",
        ))
    }
}

/// Makes a rename in `dir` durable (`fsync` of the dir on Unix; NTFS journals its metadata,
/// and Windows opens no dir as a file, so nothing there).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    if cfg!(unix) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A regular file of ours, open for reading, with what one `stat` said of it.
pub struct OwnFile {
    /// The file.
    pub file: File,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in unix seconds.
    pub modified_unix: i64,
    /// Its permission bits (`mode & 0o7777`) on Unix; `None` on Windows, where a file in the
    /// user's profile is private through its inherited DACL.
    pub mode: Option<u32>,
    /// Its group is the user's own primary group (a user-private group, as `umask 002`
    /// systems give each user): its group-write bit lets in nobody else. Always true on
    /// Windows.
    pub group_is_ours: bool,
}

/// Opens `path` for reading if it is a regular file of ours, never following a symlink and
/// never blocking on a FIFO.
pub fn open_own_regular(path: &Path) -> Result<OwnFile, Error> {
    imp::open_own_regular(path)
}

/// Windows security identifiers, as their string form (`S-1-5-21-…-1001`): ours, a process's,
/// a file's owner. The string rules are plain Rust (tested everywhere); reading them from the
/// OS is Windows only.
#[cfg(any(windows, test))]
pub mod sid {
    /// A SID in its string form.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Sid(pub String);

    impl Sid {
        /// Its relative id (the last sub-authority: 1001 for a local account), 0 if none.
        pub fn rid(&self) -> u32 {
            self.0
                .rsplit('-')
                .next()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0)
        }
    }

    /// The owner named by a security descriptor in SDDL form (`O:S-1-5-…G:…D:…`), as written
    /// (an alias such as `BA` for a well-known SID, else a SID string).
    pub fn owner_in_sddl(sddl: &str) -> Option<&str> {
        let rest = sddl.strip_prefix("O:")?;
        let end = ["G:", "D:", "S:"]
            .iter()
            .filter_map(|tag| rest.find(tag))
            .min()
            .unwrap_or(rest.len());
        Some(rest[..end].trim()).filter(|o| !o.is_empty())
    }

    /// Whether a file whose security descriptor is `sddl` is ours to trust: owned by our SID,
    /// or by the Administrators group (what an elevated process of ours writes; only an
    /// administrator can write as it, who could do anything anyway).
    pub fn owner_acceptable(sddl: &str, me: &Sid) -> bool {
        match owner_in_sddl(sddl) {
            Some(owner) => owner == me.0 || owner == "BA" || owner == "S-1-5-32-544",
            None => false,
        }
    }

    #[cfg(windows)]
    pub use os::*;

    #[cfg(windows)]
    #[allow(unsafe_code)]
    mod os {
        use super::Sid;
        use windows_sys::Win32::Foundation::{CloseHandle, LocalFree, HANDLE};
        use windows_sys::Win32::Security::Authorization::{
            ConvertSecurityDescriptorToStringSecurityDescriptorW, ConvertSidToStringSidW,
            GetSecurityInfo, SDDL_REVISION_1, SE_FILE_OBJECT,
        };
        use windows_sys::Win32::Security::{
            GetTokenInformation, TokenUser, OWNER_SECURITY_INFORMATION, TOKEN_QUERY, TOKEN_USER,
        };
        use windows_sys::Win32::System::Threading::{
            GetCurrentProcess, OpenProcess, OpenProcessToken, PROCESS_QUERY_LIMITED_INFORMATION,
        };

        /// A NUL-terminated UTF-16 string the OS allocated, read and freed.
        unsafe fn take_wide(p: *mut u16) -> String {
            let mut n = 0;
            while *p.add(n) != 0 {
                n += 1;
            }
            let s = String::from_utf16_lossy(std::slice::from_raw_parts(p, n));
            LocalFree(p.cast());
            s
        }

        /// The user SID of the process token `token`.
        unsafe fn token_sid(token: HANDLE) -> std::io::Result<Sid> {
            let mut need = 0u32;
            GetTokenInformation(token, TokenUser, std::ptr::null_mut(), 0, &mut need);
            // u64 words keep the buffer aligned for TOKEN_USER.
            let mut buf = vec![0u64; (need as usize).div_ceil(8).max(1)];
            if GetTokenInformation(token, TokenUser, buf.as_mut_ptr().cast(), need, &mut need) == 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let user = &*(buf.as_ptr() as *const TOKEN_USER);
            let mut text: *mut u16 = std::ptr::null_mut();
            if ConvertSidToStringSidW(user.User.Sid, &mut text) == 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Sid(take_wide(text)))
        }

        /// The user SID of process `process` (a handle with query rights).
        fn process_sid(process: HANDLE) -> std::io::Result<Sid> {
            let mut token: HANDLE = std::ptr::null_mut();
            // SAFETY: `process` is a valid process handle; `token` receives a handle we close.
            unsafe {
                if OpenProcessToken(process, TOKEN_QUERY, &mut token) == 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = token_sid(token);
                CloseHandle(token);
                r
            }
        }

        /// Our own user SID (read once).
        pub fn own() -> &'static Sid {
            static OWN: std::sync::OnceLock<Sid> = std::sync::OnceLock::new();
            // SAFETY: GetCurrentProcess returns a pseudo-handle valid for this process.
            OWN.get_or_init(|| {
                process_sid(unsafe { GetCurrentProcess() }).unwrap_or(Sid(String::new()))
            })
        }

        /// The user SID of process `pid`.
        pub fn of_process(pid: u32) -> std::io::Result<Sid> {
            // SAFETY: plain call; the handle is checked and closed.
            unsafe {
                let h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
                if h.is_null() {
                    return Err(std::io::Error::last_os_error());
                }
                let r = process_sid(h);
                CloseHandle(h);
                r
            }
        }

        /// Whether `file`'s owner is acceptable (see [`super::owner_acceptable`]).
        pub fn owns_file(file: &std::fs::File) -> std::io::Result<bool> {
            use std::os::windows::io::AsRawHandle;
            let mut sd = std::ptr::null_mut();
            // SAFETY: the handle is the open file's; `sd` receives a descriptor we free.
            unsafe {
                let r = GetSecurityInfo(
                    file.as_raw_handle(),
                    SE_FILE_OBJECT,
                    OWNER_SECURITY_INFORMATION,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut sd,
                );
                if r != 0 {
                    return Err(std::io::Error::from_raw_os_error(r as i32));
                }
                let mut text: *mut u16 = std::ptr::null_mut();
                let ok = ConvertSecurityDescriptorToStringSecurityDescriptorW(
                    sd,
                    SDDL_REVISION_1,
                    OWNER_SECURITY_INFORMATION,
                    &mut text,
                    std::ptr::null_mut(),
                );
                LocalFree(sd);
                if ok == 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(super::owner_acceptable(&take_wide(text), own()))
            }
        }
    }
}

#[cfg(unix)]
mod imp {
    use crate::Error;
    use rustix::fs::{Mode, OFlags};
    use std::fs::File;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    use std::path::Path;

    pub(super) fn uid() -> u32 {
        rustix::process::getuid().as_raw()
    }

    pub(super) fn private_dir(b: &mut std::fs::DirBuilder) {
        b.mode(0o700);
    }

    pub(super) fn private_file(o: &mut std::fs::OpenOptions) {
        o.mode(0o600);
    }

    pub(super) fn no_follow(o: &mut std::fs::OpenOptions) {
        o.custom_flags(OFlags::NOFOLLOW.bits() as i32);
    }

    pub(super) fn owner_and_mode(meta: &std::fs::Metadata) -> Option<(u32, u32)> {
        Some((meta.uid(), meta.mode() & 0o7777))
    }

    pub(super) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    pub(super) fn is_executable(meta: &std::fs::Metadata) -> bool {
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }

    pub(super) fn file_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
        Some((meta.dev(), meta.ino()))
    }

    pub(super) fn open_own_regular(path: &Path) -> Result<super::OwnFile, Error> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => Error::Symlink,
            rustix::io::Errno::NOENT => Error::Gone,
            e => Error::Io(e.into()),
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| Error::Io(e.into()))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(Error::NotRegular);
        }
        if stat.st_uid != uid() {
            return Err(Error::ForeignOwner(stat.st_uid));
        }
        #[allow(clippy::useless_conversion)] // time_t is not i64 on every target
        Ok(super::OwnFile {
            file: File::from(fd),
            size: u64::try_from(stat.st_size).unwrap_or(u64::MAX),
            modified_unix: i64::try_from(stat.st_mtime).unwrap_or(i64::MAX),
            mode: Some(u32::from(stat.st_mode) & 0o7777),
            group_is_ours: stat.st_gid == rustix::process::getegid().as_raw(),
        })
    }
}

#[cfg(windows)]
mod imp {
    use crate::Error;
    use std::os::windows::fs::{MetadataExt, OpenOptionsExt};
    use std::path::Path;

    const FILE_ATTRIBUTE_REPARSE_POINT: u32 = 0x400;
    const FILE_FLAG_OPEN_REPARSE_POINT: u32 = 0x0020_0000;

    pub(super) fn uid() -> u32 {
        super::sid::own().rid()
    }

    pub(super) fn private_dir(_: &mut std::fs::DirBuilder) {}

    pub(super) fn private_file(_: &mut std::fs::OpenOptions) {}

    /// The link itself is opened, not its target (a write then fails on a directory link and
    /// replaces a file link's own data, never the target's).
    pub(super) fn no_follow(o: &mut std::fs::OpenOptions) {
        o.custom_flags(FILE_FLAG_OPEN_REPARSE_POINT);
    }

    pub(super) fn owner_and_mode(_: &std::fs::Metadata) -> Option<(u32, u32)> {
        None
    }

    pub(super) fn set_mode(_: &Path, _: u32) -> std::io::Result<()> {
        Ok(())
    }

    pub(super) fn is_executable(meta: &std::fs::Metadata) -> bool {
        meta.is_file()
    }

    pub(super) fn file_identity(_: &std::fs::Metadata) -> Option<(u64, u64)> {
        Some((0, 0))
    }

    pub(super) fn open_own_regular(path: &Path) -> Result<super::OwnFile, Error> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::Gone,
                _ => Error::Io(e),
            })?;
        let meta = file.metadata()?;
        if meta.file_attributes() & FILE_ATTRIBUTE_REPARSE_POINT != 0 {
            return Err(Error::Symlink);
        }
        if !meta.is_file() {
            return Err(Error::NotRegular);
        }
        if !super::sid::owns_file(&file)? {
            return Err(Error::ForeignOwner(u32::MAX));
        }
        let modified_unix = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_secs()).ok())
            .unwrap_or(i64::MAX);
        Ok(super::OwnFile {
            file,
            size: meta.len(),
            modified_unix,
            mode: None,
            group_is_ours: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::sid::{owner_acceptable, owner_in_sddl, Sid};

    /// A lockfile's security descriptor as Windows reports it (SDDL of the owner, group and
    /// DACL of a file in a profile's `.claude\ide`, shape from `icacls /save` and
    /// `Get-Acl | % Sddl`): ours is trusted, another user's refused, whatever else it holds.
    #[test]
    fn a_lockfile_owned_by_another_sid_is_refused() {
        let me = Sid("S-1-5-21-3623811015-3361044348-30300820-1013".into());
        assert_eq!(me.rid(), 1013);
        let ours = "O:S-1-5-21-3623811015-3361044348-30300820-1013G:S-1-5-21-3623811015-3361044348-30300820-513D:AI(A;ID;FA;;;SY)(A;ID;FA;;;BA)(A;ID;FA;;;S-1-5-21-3623811015-3361044348-30300820-1013)";
        let theirs = "O:S-1-5-21-3623811015-3361044348-30300820-1014G:S-1-5-21-3623811015-3361044348-30300820-513D:AI(A;ID;FA;;;S-1-5-21-3623811015-3361044348-30300820-1013)";
        assert_eq!(
            owner_in_sddl(theirs),
            Some("S-1-5-21-3623811015-3361044348-30300820-1014")
        );
        assert!(owner_acceptable(ours, &me));
        assert!(!owner_acceptable(theirs, &me), "another SID's file");
        // Our SID as a prefix of theirs is not ours.
        let longer = "O:S-1-5-21-3623811015-3361044348-30300820-10130G:SYD:";
        assert!(!owner_acceptable(longer, &me));
        // Written by an elevated process of an administrator: the Administrators group.
        assert!(owner_acceptable("O:BAG:SYD:", &me));
        assert!(
            !owner_acceptable("O:SYG:SYD:", &me),
            "the system account is not us"
        );
        assert!(!owner_acceptable("G:SYD:", &me), "no owner at all");
        assert!(!owner_acceptable(
            "O:S-1-5-21-1-2-3-1013",
            &Sid(String::new())
        ));
    }
}
