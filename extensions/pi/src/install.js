// How this copy of pi-ide-broker was installed, and the commands that work for that way
// (issue 52: a notice that names `cargo install` to an npm user, or a bare `pi-ide-broker`
// that is not on their PATH, is a trap). Plain JavaScript, like binary.js: the launcher
// (bin/pi-ide-broker.js) and the extension both use it.

import { accessSync, constants } from "node:fs";
import { homedir } from "node:os";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";
import { PLATFORMS, platformPackage } from "./binary.js";

/**
 * `npm` when this file sits in an installed `pi-ide-broker` package (`pi install
 * npm:pi-ide-broker`, npx); `source` for a clone or the copy `pi-ide-broker setup` wrote.
 * @param {string} [from] a file URL or path inside this package
 * @returns {"npm" | "source"}
 */
export function installWay(from = import.meta.url) {
	const path = from.startsWith("file:") ? fileURLToPath(from) : from;
	return /[\\/]node_modules[\\/]pi-ide-broker[\\/]/.test(path) ? "npm" : "source";
}

/**
 * The `pi-ide-broker` launcher npm linked for this package (`<prefix>/node_modules/.bin`,
 * beside the package in the folder pi installed it into), for an npm install; else null.
 * Running it needs no npx: nothing fetched, no prompt, and it is pi's copy.
 * @param {string} [from] a file URL or path inside this package
 * @returns {string | null}
 */
export function npmBin(from = import.meta.url) {
	const path = from.startsWith("file:") ? fileURLToPath(from) : from;
	const m = /^(.*[\\/]node_modules)[\\/]pi-ide-broker[\\/]/.exec(path);
	if (!m) return null;
	const sep = path.includes("\\") && !path.includes("/") ? "\\" : "/";
	return `${m[1]}${sep}.bin${sep}pi-ide-broker`;
}

/**
 * `path` as a user pastes it into a shell: `~` for the home dir, single quotes around
 * anything a shell would split or expand.
 * @param {string} path
 * @param {string} [home]
 */
export function shellPath(path, home = homedir()) {
	const short = home && path.startsWith(`${home}/`) ? `~${path.slice(home.length)}` : path;
	if (/^[\w~./+,:@%=-]+$/.test(short)) return short;
	return `'${path.replaceAll("'", "'\\''")}'`;
}

/**
 * Whether a `pi-ide-broker` the user's shell finds is on `PATH` (npm's own `node_modules/.bin`,
 * which npx and npm scripts put in front while they run, does not count).
 * @param {string | undefined} [path]
 */
export function onPath(path = process.env.PATH) {
	for (const dir of (path ?? "").split(delimiter)) {
		if (!dir || /[\\/]node_modules[\\/]\.bin$/.test(dir)) continue;
		for (const name of process.platform === "win32" ? ["pi-ide-broker.exe", "pi-ide-broker.cmd"] : ["pi-ide-broker"]) {
			try {
				accessSync(join(dir, name), constants.X_OK);
				return true;
			} catch {
				// not here
			}
		}
	}
	return false;
}

/**
 * A command line of the broker that works for `way`: the `pi-ide-broker` on PATH when there
 * is one (setup links it), else, for an npm install, the launcher in pi's npm folder (never
 * `npx pi-ide-broker`: outside that folder npx asks to fetch the registry's newest version).
 * @param {string} args
 * @param {"npm" | "source"} [way]
 * @param {{onPath?: boolean, from?: string, home?: string}} [ctx]
 */
export function brokerCommand(args, way = installWay(), ctx = {}) {
	const bin = way === "npm" && !(ctx.onPath ?? onPath()) ? npmBin(ctx.from) : null;
	return bin ? `${shellPath(bin, ctx.home)} ${args}` : `pi-ide-broker ${args}`;
}

/**
 * How to update the daemon for `way`.
 * @param {"npm" | "source"} [way]
 */
export function updateHint(way = installWay()) {
	return way === "npm"
		? "update it: `pi update npm:pi-ide-broker`, then restart pi"
		: "update it from your clone: `cargo install --locked --path .`, then `pi-ide-broker setup`";
}

/**
 * Why this platform's binary is missing from an npm install, and the command that repairs
 * it: the launcher and the extension say the same.
 * @param {string} key `<platform>-<arch>`
 */
export function missingBinary(key) {
	if (!PLATFORMS[key]) {
		return `there is no prebuilt daemon for ${key} (${Object.keys(PLATFORMS).join(", ")} have one). Build it (\`cargo install --locked pi-ide-broker\`) and set PI_IDE_BROKER_BIN to it.`;
	}
	return `npm did not install ${platformPackage(key)}, the daemon for this platform (an optional dependency: installed with --omit=optional, or a registry without it?). Reinstall: \`pi remove npm:pi-ide-broker && pi install npm:pi-ide-broker\`.`;
}

/**
 * What to tell a user whose daemon could not be started with `command` (the spawn failed:
 * `code` is its errno name), for this platform and install way.
 * @param {string} command
 * @param {string | undefined} code
 * @param {{platform?: string, arch?: string, way?: "npm" | "source", installed?: boolean}} [ctx]
 */
export function spawnFailure(command, code, ctx = {}) {
	const platform = ctx.platform ?? process.platform;
	const arch = ctx.arch ?? process.arch;
	const way = ctx.way ?? installWay();
	const head = `Could not start the pi-ide-broker daemon (\`${command} daemon\`: ${code ?? "failed"})`;
	if (way === "npm" && !ctx.installed) return `${head}: ${missingBinary(`${platform}-${arch}`)}`;
	if (code === "EACCES") return `${head}: ${notExecutable(command)}`;
	if (code === "ENOENT") {
		return `${head}: \`${command}\` is not on PATH. Install the daemon (\`cargo install --locked --path .\` in your clone), or set PI_IDE_BROKER_BIN to it.`;
	}
	return `${head}. Check that \`${command}\` is an executable pi-ide-broker, or set PI_IDE_BROKER_BIN.`;
}

/**
 * `bin` exists but may not be run (EACCES: its exec bit is gone, which neither `pi install`
 * nor `pi update` puts back): the command that repairs it.
 * @param {string} bin
 */
export function notExecutable(bin) {
	return `${bin} is not executable (its exec bit is gone, or its folder is mounted noexec); repair it: \`chmod +x ${shellPath(bin)}\``;
}
