// What this extension tells the broker about itself (`client`, `client_version`, `protocol` on
// /v1/session), and the one check it makes itself: a daemon whose `broker/attached` carries no
// `broker` field predates the version rule. Every other skew the broker reports once, in a
// `broker/notice` (docs/protocol.md, "Versions").

import { updateHint } from "./install.js";

/** This extension's name, as `pi-ide-broker status` shows it. */
export const CLIENT_NAME = "pi-ide-broker-pi";
/** This extension's version (the repository's; a test keeps it equal to Cargo.toml's). */
export const CLIENT_VERSION = "0.1.0";
/** The native-door protocol revision this extension speaks. */
export const PROTOCOL = 2;

/** The notice for a daemon too old to say its version, or `undefined`. */
export function olderDaemonNotice(attachedParams: unknown): string | undefined {
	const p = (attachedParams ?? {}) as { broker?: unknown };
	if (p.broker !== undefined) return undefined;
	return (
		`The pi-ide-broker daemon is older than this extension (${CLIENT_NAME} ${CLIENT_VERSION}, protocol ${PROTOCOL}); ` +
		`${updateHint()}. ` +
		"Until then what both speak keeps working."
	);
}
