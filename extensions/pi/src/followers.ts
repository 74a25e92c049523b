// The ACP editors following this pi session, as the broker tells of them (`broker/followers`),
// and the prompts they sent: queued here until pi is idle (pi's own queue cannot give one
// back, and a cancelled one must never run), then running until pi settles. State only: the wiring in index.ts
// feeds it pi's and the broker's events and acts on what it says.

/** What `broker/followers` says. */
export type FollowersNotice = { count?: unknown; reviewer?: unknown; buffers?: unknown };

/** The followers of one pi session. */
export class Followers {
	/** How many ACP editors follow the session. */
	count = 0;
	/** The one that reviews diffs now (its turn is open), by its client name. */
	reviewer: string | null = null;
	/** A follower's editor offers its buffers (`fs.readTextFile`). */
	buffers = false;
	/** Followers' prompts waiting for pi to be idle, the oldest first. */
	private queued: FollowerPrompt[] = [];
	/** The follower's prompt whose run pi is in (handed to pi, not yet settled). */
	private running: FollowerPrompt | null = null;
	private unnamed = 0;

	/** A `broker/followers` notice; returns the name of a reviewer that just took over (to
	 * say so once), else null. */
	heard(notice: unknown): string | null {
		const p = (notice ?? {}) as FollowersNotice;
		const was = this.reviewer;
		this.count = typeof p.count === "number" ? p.count : 0;
		this.reviewer = typeof p.reviewer === "string" ? p.reviewer : null;
		this.buffers = p.buffers === true;
		return this.reviewer && this.reviewer !== was ? this.reviewer : null;
	}

	/** The link to the broker went: the followers went with it (they follow again once it is
	 * back, and the broker says so). */
	lost(): void {
		this.count = 0;
		this.reviewer = null;
		this.buffers = false;
	}

	/** Whether pi's transcript is mirrored now (someone follows). */
	get watched(): boolean {
		return this.count > 0;
	}

	/** A follower's prompt (`id`: the name the broker gave it; none from an older broker),
	 * queued: resolves with whether it was stopped (its run aborted, or it was cancelled before
	 * it ran) once its run has settled. */
	prompt(id: string | undefined, text: string): Promise<boolean> {
		return new Promise<boolean>((done) => this.queued.push({ id: id ?? `unnamed-${++this.unnamed}`, named: id !== undefined, text, done }));
	}

	/** pi is idle: the text of the oldest queued prompt to hand to pi now (it runs from now
	 * on), or null (none waits, or one of ours runs already). */
	next(idle: boolean): string | null {
		if (!idle || this.running) return null;
		this.running = this.queued.shift() ?? null;
		return this.running?.text ?? null;
	}

	/** `pi/cancel {prompt}`: a queued prompt leaves the queue, answered as stopped
	 * ("dropped"); the running one is to be aborted by the caller ("abort"), whose run then
	 * settles; another (the terminal's own turn, a prompt answered already) is not touched
	 * ("none"). A cancel naming no prompt (an older ACP door) stops every follower's prompt,
	 * and one the broker did not name (an older broker) is stopped by any cancel. */
	cancel(id: string | undefined): "abort" | "dropped" | "none" {
		const hit = (p: FollowerPrompt) => id === undefined || !p.named || p.id === id;
		const dropped = this.queued.filter(hit);
		this.queued = this.queued.filter((p) => !hit(p));
		for (const p of dropped) p.done(true);
		if (this.running && hit(this.running)) return "abort";
		return dropped.length > 0 ? "dropped" : "none";
	}

	/** pi settled (`aborted`: its run was stopped): the prompt whose run it was is answered. */
	settled(aborted: boolean): void {
		const p = this.running;
		this.running = null;
		p?.done(aborted);
	}

	/** The running prompt's run never began (aborted before it started): answered stopped. */
	unstarted(): void {
		this.settled(true);
	}

	/** The session ends: every prompt, queued or running, is answered as stopped. */
	ended(): void {
		this.settled(true);
		for (const p of this.queued.splice(0)) p.done(true);
	}
}

/** A follower's prompt held for pi. */
type FollowerPrompt = {
	/** The broker's name for it (what `pi/cancel` names). */
	id: string;
	/** The broker named it (an older broker does not). */
	named: boolean;
	text: string;
	/** Answers it: whether it was stopped. */
	done: (aborted: boolean) => void;
};
