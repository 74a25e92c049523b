// The ACP editors following this pi session, as the broker tells of them (`broker/followers`),
// and the prompts they sent that wait for pi to settle. State only: the wiring in index.ts
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
	private waiting: ((aborted: boolean) => void)[] = [];

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

	/** A follower's prompt was handed to pi: resolves with whether pi's run was aborted, once
	 * pi has settled. */
	untilSettled(): Promise<boolean> {
		return new Promise<boolean>((done) => this.waiting.push(done));
	}

	/** pi settled (or was stopped before its run began, or the session ended: `aborted`):
	 * every prompt waiting is answered. */
	settled(aborted: boolean): void {
		for (const w of this.waiting.splice(0)) w(aborted);
	}
}
