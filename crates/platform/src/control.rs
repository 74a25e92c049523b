//! Stop and reload: what a running daemon listens for, and how another process asks.
//!
//! On Unix the requests are signals: TERM and INT stop, HUP reloads the config (what systemd,
//! launchd and a terminal's Ctrl-C send). Windows has no signals between processes: the
//! daemon makes two named events of its own, `Local\pi-ide-broker-<pid>-stop` and `-reload`,
//! and `stop` sets one; Ctrl-C, Ctrl-Break and the console closing stop it as well. Only a
//! process of the same logon session can open a `Local\` event, and only one the event's
//! default DACL lets in (the user who made it, and the system).

/// What another process asked of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Stop gracefully (pending diffs answered, sessions told).
    Stop,
    /// Read the config file again.
    Reload,
}

/// The daemon's ear for stop and reload requests, from [`Requests::listen`].
pub struct Requests(imp::Ear);

impl Requests {
    /// Starts listening (before the daemon says it is ready, so no request is lost).
    pub fn listen() -> std::io::Result<Requests> {
        imp::Ear::listen().map(Requests)
    }

    /// The next request.
    pub async fn next(&mut self) -> Request {
        self.0.next().await
    }
}

/// Asks the daemon with `pid` to stop gracefully.
pub fn request_stop(pid: u32) -> std::io::Result<()> {
    imp::send(pid, Request::Stop)
}

/// Asks the daemon with `pid` to reload its config.
pub fn request_reload(pid: u32) -> std::io::Result<()> {
    imp::send(pid, Request::Reload)
}

/// How the user ends `pid` by force when it does not stop (for messages).
pub fn force_hint(pid: u32) -> String {
    if cfg!(windows) {
        format!("`taskkill /F /PID {pid}`")
    } else {
        format!("`kill -9 {pid}`")
    }
}

/// Makes `cmd` start detached from our terminal and process group, so a Ctrl-C in the shell
/// that started a client does not stop the daemon it started.
pub fn detach(cmd: &mut std::process::Command) {
    imp::detach(cmd);
}

#[cfg(unix)]
mod imp {
    use super::Request;
    use tokio::signal::unix::{signal, Signal, SignalKind};

    pub(super) struct Ear {
        term: Signal,
        int: Signal,
        hup: Signal,
    }

    impl Ear {
        pub(super) fn listen() -> std::io::Result<Ear> {
            Ok(Ear {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
            })
        }

        pub(super) async fn next(&mut self) -> Request {
            tokio::select! {
                _ = self.term.recv() => Request::Stop,
                _ = self.int.recv() => Request::Stop,
                _ = self.hup.recv() => Request::Reload,
            }
        }
    }

    pub(super) fn send(pid: u32, what: Request) -> std::io::Result<()> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a pid"))?;
        let signal = match what {
            Request::Stop => rustix::process::Signal::TERM,
            Request::Reload => rustix::process::Signal::HUP,
        };
        Ok(rustix::process::kill_process(pid, signal)?)
    }

    pub(super) fn detach(cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
}

#[cfg(windows)]
#[allow(unsafe_code)]
mod imp {
    use super::Request;
    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, WAIT_OBJECT_0};
    use windows_sys::Win32::System::Threading::{
        CreateEventW, OpenEventW, SetEvent, WaitForMultipleObjects, EVENT_MODIFY_STATE, INFINITE,
    };

    fn name(pid: u32, what: Request) -> Vec<u16> {
        let kind = match what {
            Request::Stop => "stop",
            Request::Reload => "reload",
        };
        format!("Local\\pi-ide-broker-{pid}-{kind}")
            .encode_utf16()
            .chain(Some(0))
            .collect()
    }

    /// An event handle owned by us (closed on drop); a number so it may cross threads.
    struct Event(usize);

    impl Event {
        fn create(what: Request) -> std::io::Result<Event> {
            let name = name(std::process::id(), what);
            // SAFETY: `name` is a NUL-terminated UTF-16 string that outlives the call; null
            // security attributes mean the default DACL of our token.
            let h = unsafe { CreateEventW(std::ptr::null(), 0, 0, name.as_ptr()) };
            if h.is_null() {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Event(h as usize))
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            // SAFETY: the handle is ours, from CreateEventW, and closed once.
            unsafe { CloseHandle(self.0 as HANDLE) };
        }
    }

    pub(super) struct Ear {
        rx: tokio::sync::mpsc::UnboundedReceiver<Request>,
    }

    impl Ear {
        pub(super) fn listen() -> std::io::Result<Ear> {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let events = [
                Event::create(Request::Stop)?,
                Event::create(Request::Reload)?,
            ];
            let ctrl = tx.clone();
            tokio::spawn(async move {
                // Ctrl-C, Ctrl-Break, the console closed: stop.
                if tokio::signal::ctrl_c().await.is_ok() {
                    let _ = ctrl.send(Request::Stop);
                }
            });
            std::thread::Builder::new()
                .name("control-events".into())
                .spawn(move || {
                    let handles = [events[0].0 as HANDLE, events[1].0 as HANDLE];
                    loop {
                        // SAFETY: both handles stay open for the loop's life (`events` is
                        // moved into this thread and dropped only when it ends).
                        let r = unsafe { WaitForMultipleObjects(2, handles.as_ptr(), 0, INFINITE) };
                        let what = match r.wrapping_sub(WAIT_OBJECT_0) {
                            0 => Request::Stop,
                            1 => Request::Reload,
                            _ => break,
                        };
                        if tx.send(what).is_err() {
                            break;
                        }
                    }
                    drop(events);
                })?;
            Ok(Ear { rx })
        }

        pub(super) async fn next(&mut self) -> Request {
            match self.rx.recv().await {
                Some(r) => r,
                // The waiting thread failed: nothing can ask any more; wait forever.
                None => std::future::pending().await,
            }
        }
    }

    pub(super) fn send(pid: u32, what: Request) -> std::io::Result<()> {
        let name = name(pid, what);
        // SAFETY: `name` is NUL-terminated UTF-16 and outlives the call.
        let h = unsafe { OpenEventW(EVENT_MODIFY_STATE, 0, name.as_ptr()) };
        if h.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `h` is a valid event handle we opened, closed right after.
        let ok = unsafe { SetEvent(h) };
        let err = std::io::Error::last_os_error();
        // SAFETY: as above; closed once.
        unsafe { CloseHandle(h) };
        if ok == 0 {
            return Err(err);
        }
        Ok(())
    }

    pub(super) fn detach(cmd: &mut std::process::Command) {
        use std::os::windows::process::CommandExt;
        const DETACHED_PROCESS: u32 = 0x0000_0008;
        const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP);
    }
}
