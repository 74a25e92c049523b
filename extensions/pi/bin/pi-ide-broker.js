#!/usr/bin/env node
// `pi-ide-broker` from npm (`~/.pi/agent/npm/node_modules/.bin/pi-ide-broker setup`, or
// `npx pi-ide-broker status`): runs the binary of this platform's package (src/binary.js) with
// the same arguments, standard streams and exit status, and hands it the signals this process
// gets (a service manager's stop, Ctrl-C). It tells the binary how a shell reaches this
// launcher (`PI_IDE_BROKER_LAUNCHER`), so that its hints name a command that exists.

import { spawn } from "node:child_process";
import { platformBinary } from "../src/binary.js";
import { missingBinary, notExecutable, npmBin, shellPath } from "../src/install.js";

const key = `${process.platform}-${process.arch}`;
const bin = process.env.PI_IDE_BROKER_BIN || platformBinary();
if (!bin) {
	console.error(`pi-ide-broker: cannot find the daemon's binary: ${missingBinary(key)}`);
	process.exit(1);
}
const launcher = npmBin() ?? process.argv[1];
const env = { ...process.env, PI_IDE_BROKER_LAUNCHER: launcher ? shellPath(launcher) : "" };
const child = spawn(bin, process.argv.slice(2), { stdio: "inherit", env });
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => child.kill(sig));
child.on("error", (err) => {
	const code = /** @type {NodeJS.ErrnoException} */ (err).code;
	const why = code === "EACCES" ? `EACCES: ${notExecutable(bin)}` : err.message;
	console.error(`pi-ide-broker: cannot run ${bin}: ${why}`);
	process.exit(1);
});
child.on("exit", (code, signal) => {
	if (signal) {
		process.removeAllListeners(signal);
		process.kill(process.pid, signal);
	} else process.exit(code ?? 1);
});
