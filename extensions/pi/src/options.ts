// Settings of the extension and where the broker lives.
//
// Settings key `pi-ide-broker` in pi's settings (project `.pi/settings.json` overrides the
// global `~/.pi/agent/settings.json`, as pi merges them):
//   autoconnect  attach on session start through the broker's routing   (default true)
//   spawn        start `pi-ide-broker daemon` when none is running        (default true)
//   command      the broker binary    (default: the one npm installed with this package, for
//                this platform (src/binary.js), else "pi-ide-broker" on PATH)
//   socket       the broker's socket (default: asked from `pi-ide-broker paths`)
// Environment: PI_IDE_BROKER_NO_SPAWN=1 turns spawning off; PI_IDE_BROKER_SOCKET and
// PI_IDE_BROKER_BIN override `socket` and `command`.

import { execFile } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { platformBinary } from "./binary.js";
import { lastLineOf } from "./broker.ts";

/** What the extension was configured to do. */
export type Options = {
	autoconnect: boolean;
	spawn: boolean;
	command: string;
	socket: string | undefined;
};

const SETTINGS_KEY = "pi-ide-broker";

function truthy(v: string | undefined): boolean {
	return v !== undefined && ["1", "true", "yes", "on"].includes(v.trim().toLowerCase());
}

/** Reads the options from pi's merged settings and the environment; `installed` is the binary
 * of this platform's npm package, when there is one. */
export function readOptions(
	settings: unknown,
	env: NodeJS.ProcessEnv,
	installed: string | null = platformBinary(),
): Options {
	const all = (settings && typeof settings === "object" ? settings : {}) as Record<string, unknown>;
	const raw = all[SETTINGS_KEY];
	const mine = (raw && typeof raw === "object" ? raw : {}) as Record<string, unknown>;
	const bool = (v: unknown, dflt: boolean) => (typeof v === "boolean" ? v : dflt);
	const str = (v: unknown) => (typeof v === "string" && v.trim() !== "" ? v : undefined);
	return {
		autoconnect: bool(mine.autoconnect, true),
		spawn: bool(mine.spawn, true) && !truthy(env.PI_IDE_BROKER_NO_SPAWN),
		command: str(env.PI_IDE_BROKER_BIN) ?? str(mine.command) ?? installed ?? "pi-ide-broker",
		socket: str(env.PI_IDE_BROKER_SOCKET) ?? str(mine.socket),
	};
}

/** Where the broker keeps its socket and log, as the broker itself resolves them; `named` when
 * the user named the socket (`PI_IDE_BROKER_SOCKET`, the `socket` setting) rather than taking
 * the daemon's (the trust check differs: src/socket_trust.ts); `problem`, the last line the
 * binary wrote when it could not say (a broken config file, which stops its daemon too). */
export type BrokerPaths = { socket: string; log: string | undefined; named: boolean; problem?: string };

/** True when `dir` is a directory owned by `uid`. */
function ownDir(dir: string, uid: number): boolean {
	try {
		const st = statSync(dir);
		return st.isDirectory() && st.uid === uid;
	} catch {
		return false;
	}
}

/** The socket path without asking the binary: the daemon's own defaults, in its order
 * (`Config::socket_path`): `PI_IDE_BROKER_SOCKET`, `$XDG_RUNTIME_DIR`, `/run/user/<uid>` when
 * it is ours, else `$TMPDIR` or `/tmp` as Rust's `temp_dir` reads it (node's `os.tmpdir()`
 * also reads `TMP` and `TEMP`, which the daemon never does). */
export function defaultSocket(
	env: NodeJS.ProcessEnv,
	uid: number,
	isOwnDir: (dir: string, uid: number) => boolean = ownDir,
): string {
	if (env.PI_IDE_BROKER_SOCKET) return env.PI_IDE_BROKER_SOCKET;
	if (env.XDG_RUNTIME_DIR) return join(env.XDG_RUNTIME_DIR, "pi-ide-broker", "sock");
	const runUser = `/run/user/${uid}`;
	if (isOwnDir(runUser, uid)) return join(runUser, "pi-ide-broker", "sock");
	return join(env.TMPDIR || "/tmp", `pi-ide-broker-${uid}`, "sock");
}

/** Asks `<command> paths --json` (so a config file's `socket` key counts); falls back to the
 * defaults when the binary is missing or fails. */
export function resolvePaths(opts: Options, env: NodeJS.ProcessEnv): Promise<BrokerPaths> {
	const fallback: BrokerPaths = {
		socket: opts.socket ?? defaultSocket(env, process.getuid?.() ?? 0),
		log: undefined,
		named: opts.socket !== undefined,
	};
	return new Promise((done) => {
		execFile(opts.command, ["paths", "--json"], { timeout: 3000, env }, (err, stdout, stderr) => {
			if (err) return done({ ...fallback, problem: lastLineOf(String(stderr)) });
			try {
				const p = JSON.parse(stdout) as { socket?: string; log?: string };
				done({ socket: opts.socket ?? p.socket ?? fallback.socket, log: p.log, named: fallback.named });
			} catch {
				done(fallback);
			}
		});
	});
}
