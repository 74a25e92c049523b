// Whether whatever listens at the broker's socket path can be the user's own daemon, checked
// before a single byte is sent to it (issue 61: where XDG_RUNTIME_DIR is unset the socket dir
// sits in a shared temp dir, and another user who creates `/tmp/pi-ide-broker-<uid>` first and
// listens there would otherwise be sent the user's files).
//
// Node cannot read SO_PEERCRED, so the listener is never asked who it is: the path proves it.
// Only the user (and root) can create an entry in a directory that is the user's and closed to
// group and others, and nobody else can rename or replace that directory while every directory
// above it is root's or the user's and, where open to others, sticky (like /tmp). A socket in
// such a place, owned by the user, was bound by one of the user's processes: the daemon, which
// itself refuses any other socket dir (`secure_dir` in crates/platform/src/local/unix.rs).
//
// Windows is not checked here: the socket is a named pipe (`\\.\pipe\…`), which has no
// directory to prove anything, and node cannot ask a pipe who serves it either. The daemon's
// pipe carries its own guard there: a DACL of the user alone, created first
// (FILE_FLAG_FIRST_PIPE_INSTANCE), so the daemon refuses, and says so, a pipe of its name
// that someone else made (crates/platform/src/local/windows.rs, docs/windows.md).

import { lstatSync, readlinkSync, type Stats } from "node:fs";
import { basename, dirname, isAbsolute, join, resolve } from "node:path";

/** What the socket path says about its listener. */
export type Trust =
	/** The user's own: dial it. */
	| { kind: "trusted" }
	/** Nothing listens there (no socket, or no socket dir yet), and the place is safe: no
	 * daemon runs, so one may be started. Not dialled either: in a shared dir the squatter could
	 * create the path between this check and the dial. */
	| { kind: "absent" }
	/** Someone else may be listening: never dial, never start a daemon there; `problem` says
	 * what is wrong and what to do. */
	| { kind: "refused"; problem: string };

export type TrustOptions = {
	/** The user named this path (`PI_IDE_BROKER_SOCKET`, the `socket` setting) instead of taking
	 * the daemon's default: it may be a socket handed over by `ssh -R` into /tmp
	 * (docs/configuration.md), so its own dir may be shared like /tmp, sticky, where the
	 * socket's owner then tells (nobody else can replace it there). */
	named?: boolean;
	/** Ours; `process.getuid()` unless a test says otherwise. */
	uid?: number;
	/** `process.platform` unless a test says otherwise. */
	platform?: NodeJS.Platform;
	/** `process.env` unless a test says otherwise (for {@link TRUST_UID_ENV}). */
	env?: NodeJS.ProcessEnv;
};

/** Other uids whose broker a client may dial, comma-separated: a rootful container's root
 * reaching its host user's bind-mounted socket (as the daemon's own clients read it,
 * crates/platform/src/local/unix.rs). */
export const TRUST_UID_ENV = "PI_IDE_BROKER_TRUST_UID";

/** How many symbolic links a path may pass through (Linux's own limit). */
const MAX_LINKS = 40;

class Refused {
	problem: string;
	constructor(problem: string) {
		this.problem = problem;
	}
}
class Absent {}

const mode = (st: Stats) => (st.mode & 0o7777).toString(8).padStart(4, "0");
const open = (st: Stats) => (st.mode & 0o022) !== 0;
const sticky = (st: Stats) => (st.mode & 0o1000) !== 0;

/** The uids listed in {@link TRUST_UID_ENV}. */
export function trustedUids(env: NodeJS.ProcessEnv): number[] {
	return (env[TRUST_UID_ENV] ?? "")
		.split(",")
		.map((u) => u.trim())
		.filter((u) => /^\d+$/.test(u))
		.map(Number);
}

/**
 * Checks the socket at `socket` before it is dialled. The default path is held to what the
 * daemon makes (`secure_dir`): every directory above the socket's is root's or ours and, if
 * writable by group or others, sticky; the socket's directory is a real directory (not a
 * symlink), ours, not writable by group or others; the socket is a socket and ours. "Ours"
 * takes in root and the uids of {@link TRUST_UID_ENV}, as the daemon's own clients do.
 */
export function socketTrust(socket: string, opts: TrustOptions = {}): Trust {
	const platform = opts.platform ?? process.platform;
	// A named pipe: its DACL is the daemon's check (see the top of this file).
	if (platform === "win32") return { kind: "trusted" };
	const uid = opts.uid ?? process.getuid?.() ?? 0;
	const named = opts.named ?? false;
	// Whose dirs and sockets count as the user's: theirs, root's (who can do anything anyway)
	// and those the user listed.
	const trusted = [uid, 0, ...trustedUids(opts.env ?? process.env)];
	const whose = (owner: number) =>
		`uid ${owner}, not you (uid ${uid})${uid === 0 ? ` (to reach that user's broker as root, set ${TRUST_UID_ENV}=${owner})` : ""}`;
	const path = resolve(socket);
	const dir = dirname(path);
	const advice = named
		? "or set PI_IDE_BROKER_SOCKET (or the `socket` setting) to a socket in a dir of yours that others cannot write"
		: "or set XDG_RUNTIME_DIR to a private dir (or PI_IDE_BROKER_SOCKET to a socket in one)";
	const fail = (what: string, fix: string): never => {
		throw new Refused(`Not connecting to pi-ide-broker: ${what}. ${fix}, ${advice}.`);
	};
	const removal = (p: string, st: Stats, recursive: boolean) =>
		`Remove it (\`${st.uid === uid || uid === 0 ? "" : "sudo "}rm ${recursive ? "-rf " : ""}${p}\`)`;
	const stat = (p: string): Stats => {
		try {
			return lstatSync(p);
		} catch (err) {
			const code = (err as NodeJS.ErrnoException).code;
			if (code === "ENOENT") throw new Absent();
			return fail(`cannot check ${p} (${code ?? String(err)})`, "Check its permissions");
		}
	};
	/** A directory the path passes through: a squatter must not be able to swap what is in it. */
	const ancestor = (p: string, st: Stats, what = `the dir ${p} above the broker socket`) => {
		if (!trusted.includes(st.uid)) {
			fail(
				`${what} belongs to ${whose(st.uid)}: its owner could put their own socket in the broker's place`,
				"Move the socket elsewhere",
			);
		}
		if (open(st) && !sticky(st)) {
			fail(
				`${what} is writable by others (mode ${mode(st)}) without the sticky bit: anyone could put their own socket in the broker's place`,
				`Run \`chmod +t ${p}\` (or \`chmod go-w ${p}\`)`,
			);
		}
	};
	const link = (p: string): string => {
		try {
			return readlinkSync(p);
		} catch (err) {
			return fail(`cannot read the symlink ${p} (${(err as NodeJS.ErrnoException).code ?? String(err)})`, "Check it");
		}
	};
	/** `p` resolved one component at a time, every directory on the way (and every symlink
	 * followed) checked as an ancestor, the one it ends at by `last` (default: as an ancestor);
	 * returns its real path. */
	const walk = (p: string, last: (p: string, st: Stats) => void = ancestor): string => {
		ancestor("/", stat("/"));
		let cur = "/";
		let rest = p.split("/").filter((c) => c !== "" && c !== ".");
		let links = 0;
		while (rest.length > 0) {
			const part = rest.shift() as string;
			if (part === "..") {
				cur = dirname(cur);
				continue;
			}
			const next = join(cur, part);
			const st = stat(next);
			if (st.isSymbolicLink()) {
				// Its target is fixed, but in a shared dir (like /tmp) its owner can replace it.
				if (!trusted.includes(st.uid)) {
					fail(
						`${next} on the way to the broker socket is a symlink of ${whose(st.uid)}: its owner chooses where the socket is`,
						"Move the socket elsewhere",
					);
				}
				if (++links > MAX_LINKS) fail(`too many symlinks on the way to ${path}`, "Shorten the path");
				const target = link(next);
				if (isAbsolute(target)) cur = "/";
				rest = [...target.split("/").filter((c) => c !== "" && c !== "."), ...rest];
				continue;
			}
			if (!st.isDirectory()) fail(`${next} on the way to the broker socket is not a directory`, removal(next, st, false));
			(rest.length === 0 ? last : ancestor)(next, st);
			cur = next;
		}
		return cur;
	};

	try {
		let real: string;
		if (named) {
			// Its own dir may be shared like /tmp (an `ssh -R` forward's `/tmp/pi-ide-broker.sock`):
			// held to the ancestors' rule (sticky if open), the socket's owner then tells.
			real = walk(dir, (p, st) => ancestor(p, st, `the broker socket dir ${p}`));
		} else {
			// The socket dir itself: lstat, not stat. A symlink there (in a shared /tmp: its
			// owner's, who can point it elsewhere at any time) is no dir of the daemon's.
			const parent = walk(dirname(dir));
			real = join(parent, basename(dir));
			const st = stat(real);
			if (st.isSymbolicLink()) {
				fail(
					`the broker socket dir ${dir} is a symlink (to ${link(real)}): whoever made it may be listening at its other end`,
					removal(dir, st, false),
				);
			}
			if (!st.isDirectory()) fail(`the broker socket dir ${dir} is not a directory`, removal(dir, st, false));
			if (!trusted.includes(st.uid)) {
				fail(
					`the broker socket dir ${dir} belongs to ${whose(st.uid)}: someone else may be listening there`,
					removal(dir, st, true),
				);
			}
			if (open(st)) {
				fail(
					`the broker socket dir ${dir} is writable by others (mode ${mode(st)}): someone else may have put a socket there`,
					`Run \`chmod 700 ${dir}\` and remove anything in it that is not yours`,
				);
			}
		}
		const st = stat(join(real, basename(path)));
		if (!st.isSocket()) fail(`${path} is not a socket`, removal(path, st, false));
		// Whoever bound a socket owns it (only root can chown it): in a dir nobody else can write
		// or, sticky, replace entries in, this is who listens.
		if (!trusted.includes(st.uid)) {
			fail(
				`the broker socket ${path} belongs to ${whose(st.uid)}: someone else is listening there`,
				removal(path, st, false),
			);
		}
		return { kind: "trusted" };
	} catch (err) {
		if (err instanceof Absent) return { kind: "absent" };
		if (err instanceof Refused) return { kind: "refused", problem: err.problem };
		throw err;
	}
}
