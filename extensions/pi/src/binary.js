// Where the daemon's binary is when pi-ide-broker came from npm: in the platform package npm
// installed beside this one (`optionalDependencies`, one per os/cpu, each with `os`/`cpu` set
// so npm installs only the matching one), at `vendor/<target triple>/bin/pi-ide-broker` (`.exe`
// on Windows), the layout Codex and esbuild ship. Plain JavaScript so that both the extension (TypeScript) and
// the `pi-ide-broker` launcher (bin/pi-ide-broker.js, run by any node) import it.

import { chmodSync, existsSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

/** `<platform>-<arch>` (node's names) → the Rust target its package's binary is built for. */
export const PLATFORMS = {
	"linux-x64": "x86_64-unknown-linux-musl",
	"linux-arm64": "aarch64-unknown-linux-musl",
	"darwin-x64": "x86_64-apple-darwin",
	"darwin-arm64": "aarch64-apple-darwin",
	"win32-x64": "x86_64-pc-windows-gnu",
};

/** The binary's file name on `platform` (node's name). */
export function binaryName(platform = process.platform) {
	return platform === "win32" ? "pi-ide-broker.exe" : "pi-ide-broker";
}

/** The npm package holding the binary for `key` (`linux-x64`, ...). */
export function platformPackage(key) {
	return `pi-ide-broker-${key}`;
}

/**
 * The binary from this platform's package as npm installed it next to `from` (a file URL or
 * path inside the `pi-ide-broker` package), or null: no package for this platform, or none
 * installed (a clone, a git source, `--omit=optional`).
 * @param {string} [from]
 * @param {string} [platform]
 * @param {string} [arch]
 * @returns {string | null}
 */
export function platformBinary(from = import.meta.url, platform = process.platform, arch = process.arch) {
	const key = `${platform}-${arch}`;
	const triple = PLATFORMS[key];
	if (!triple) return null;
	let manifest;
	try {
		manifest = createRequire(from).resolve(`${platformPackage(key)}/package.json`);
	} catch {
		return null;
	}
	const bin = join(dirname(manifest), "vendor", triple, "bin", binaryName(platform));
	if (!existsSync(bin)) return null;
	if (platform !== "win32") repairExecBit(bin);
	return bin;
}

/**
 * Gives `bin` back the exec bits its read bits allow when it has none (an unpacker or a copy
 * that dropped them; `pi install` and `pi update` do not put them back). Whether it is
 * executable by its owner now; a failure is left for the spawn to report (EACCES), with the
 * command that repairs it.
 * @param {string} bin
 * @returns {boolean}
 */
export function repairExecBit(bin) {
	try {
		const mode = statSync(bin).mode & 0o7777;
		if (mode & 0o100) return true;
		chmodSync(bin, mode | ((mode & 0o444) >> 2));
		return true;
	} catch {
		return false;
	}
}
