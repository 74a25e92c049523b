// How this copy of pi-ide-broker was installed, and the commands that work for that way
// (issue 52: a notice that names `cargo install` to an npm user, or a bare `pi-ide-broker`
// that is not on their PATH, is a trap). Plain JavaScript, like binary.js: the launcher
// (bin/pi-ide-broker.js) and the extension both use it.

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
 * A command line of the broker that works for `way`: through npx for an npm install (its
 * binary is inside pi's npm folder, not on PATH), else the `pi-ide-broker` on PATH.
 * @param {string} args
 * @param {"npm" | "source"} [way]
 */
export function brokerCommand(args, way = installWay()) {
	return way === "npm" ? `npx pi-ide-broker ${args}` : `pi-ide-broker ${args}`;
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
	const key = `${platform}-${arch}`;
	const head = `Could not start the pi-ide-broker daemon (\`${command} daemon\`: ${code ?? "failed"})`;
	if (way === "npm" && !ctx.installed) {
		if (!PLATFORMS[key]) {
			return `${head}: there is no prebuilt daemon for ${key}. Build it (\`cargo install --locked --git <the pi-ide-broker repository> pi-ide-broker\`) and set PI_IDE_BROKER_BIN to it.`;
		}
		return `${head}: npm did not install ${platformPackage(key)}, the daemon for this platform (an optional dependency: installed with --omit=optional, or a registry without it?). Reinstall: \`pi remove npm:pi-ide-broker && pi install npm:pi-ide-broker\`.`;
	}
	if (code === "ENOENT") {
		return `${head}: \`${command}\` is not on PATH. Install the daemon (\`cargo install --locked --path .\` in your clone), or set PI_IDE_BROKER_BIN to it.`;
	}
	return `${head}. Check that \`${command}\` is an executable pi-ide-broker, or set PI_IDE_BROKER_BIN.`;
}
