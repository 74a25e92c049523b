#!/usr/bin/env node
// `pi-ide-broker` from npm (`npx pi-ide-broker status`): runs the binary of this platform's
// package (src/binary.js) with the same arguments, standard streams and exit status, and hands
// it the signals this process gets (a service manager's stop, Ctrl-C).

import { spawn } from "node:child_process";
import { PLATFORMS, platformBinary, platformPackage } from "../src/binary.js";

const key = `${process.platform}-${process.arch}`;
const bin = process.env.PI_IDE_BROKER_BIN || platformBinary();
if (!bin) {
	const why = PLATFORMS[key]
		? `the package ${platformPackage(key)} is not installed (npm skips optional dependencies under --omit=optional); reinstall without that option`
		: `there is no prebuilt binary for ${key} (${Object.keys(PLATFORMS).join(", ")} have one)`;
	console.error(`pi-ide-broker: cannot find the binary: ${why}, or build it: cargo install --locked pi-ide-broker`);
	process.exit(1);
}
const child = spawn(bin, process.argv.slice(2), { stdio: "inherit" });
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => child.kill(sig));
child.on("error", (err) => {
	console.error(`pi-ide-broker: cannot run ${bin}: ${err.message}`);
	process.exit(1);
});
child.on("exit", (code, signal) => {
	if (signal) {
		process.removeAllListeners(signal);
		process.kill(process.pid, signal);
	} else process.exit(code ?? 1);
});
