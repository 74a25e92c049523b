// Drives a code-server workbench in headless Chromium through playwright-core, for the VS Code
// tests (tests/suite/common/vscode.rs). The extension host runs only while a browser has the
// workbench open, so this process stays up for the whole test.
//
// Environment: PLAYWRIGHT (playwright-core's dir), CHROMIUM (the browser), URL (the workbench),
// PROFILE (a fresh --user-data-dir). Commands on stdin, one JSON object a line, each answered
// on stdout by {"id", "ok", "error"?}:
//   {"id", "cmd": "command", "title"}   run a command by its title through the palette (F1)
//   {"id", "cmd": "click", "label"}     click the first element with that aria-label
//   {"id", "cmd": "click", "selector"}  click the first element matching a CSS selector
//   {"id", "cmd": "type", "text"}       type into whatever has the focus
//   {"id", "cmd": "press", "key"}       press a key (playwright's names, e.g. "Control+End")
//   {"id", "cmd": "reload"}             reload the page (a new extension host)
//   {"id", "cmd": "screenshot", "path"} save a screenshot (for a failing test's report)
// First line on stdout: {"ready": true} once the workbench shows.
import { createRequire } from "node:module";
import readline from "node:readline";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT);

const say = (v) => process.stdout.write(JSON.stringify(v) + "\n");

// A fresh profile dir (playwright passes it as --user-data-dir).
const browser = await chromium.launchPersistentContext(process.env.PROFILE, {
  executablePath: process.env.CHROMIUM,
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const page = browser.pages()[0] ?? (await browser.newPage());
page.setDefaultTimeout(60000);
await page.goto(process.env.URL);
await page.locator(".monaco-workbench").waitFor();
say({ ready: true });

async function palette(title) {
  await page.locator(".monaco-workbench").click({ position: { x: 5, y: 5 }, force: true }).catch(() => {});
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor();
  await input.fill(">" + title);
  await page.locator(".quick-input-list .monaco-list-row", { hasText: title }).first().waitFor();
  await page.keyboard.press("Enter");
}

const run = {
  command: (c) => palette(c.title),
  click: (c) =>
    page.locator(c.selector ?? `[aria-label="${c.label}"]`).first().click({ timeout: 5000 }),
  type: (c) => page.keyboard.type(c.text),
  press: (c) => page.keyboard.press(c.key),
  screenshot: (c) => page.screenshot({ path: c.path }),
  reload: async () => {
    await page.reload();
    await page.locator(".monaco-workbench").waitFor();
  },
};

for await (const line of readline.createInterface({ input: process.stdin })) {
  let c;
  try {
    c = JSON.parse(line);
    await run[c.cmd](c);
    say({ id: c.id, ok: true });
  } catch (e) {
    say({ id: c?.id ?? null, ok: false, error: String(e?.message ?? e) });
  }
}
await browser.close();
