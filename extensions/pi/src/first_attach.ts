// The session's first attach while it is in flight. A host that prompts right after starting
// a session (pi-web: a new chat always starts with a message) reaches its first model call
// before the broker has attached the session; that call waits here, bounded, so it carries the
// editor's context too.

/** The first attach of one session: begun on `session_start` (autoconnect on), settled by the
 * attach or by any sign that it will not come soon (no broker, no editor, detached, shutdown,
 * or the bound ran out once). Once settled it never delays anything again. */
export class FirstAttach {
	private inFlight = false;
	private waiters: (() => void)[] = [];

	/** A first attach is under way. */
	begin(): void {
		this.inFlight = true;
	}

	/** It happened, or will not come soon: every waiter goes on at once. */
	settle(): void {
		this.inFlight = false;
		for (const w of this.waiters.splice(0)) w();
	}

	/** True between [`begin`] and [`settle`]. */
	pending(): boolean {
		return this.inFlight;
	}

	/** Resolves once settled, or after `ms` (which settles it: a later call does not wait
	 * again); at once when nothing is in flight. */
	wait(ms: number): Promise<void> {
		if (!this.inFlight) return Promise.resolve();
		return new Promise((done) => {
			const t = setTimeout(() => this.settle(), ms);
			this.waiters.push(() => {
				clearTimeout(t);
				done();
			});
		});
	}
}
