// Opens a `timeoutd plugin whatif` report in headless Chromium and checks that its chart is
// drawn (the later-released bars) and its tables are filled.
// Usage: node whatif.test.mjs PATH/whatif.html  (exit 0 on success)
import { chromium } from "playwright-core";

const [report] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto("file://" + report);
  const later = await page.locator("svg.shift-chart rect.later").count();
  const transitions = await page.locator("#transitions tr").allTextContents();
  const examples = await page.locator("#examples tr").count();
  if (errors.length) throw new Error("page errors: " + errors.join("; "));
  if (later < 1) throw new Error("no later-released bar drawn");
  if (!transitions.some((t) => t.includes("cancel→wait"))) throw new Error("transitions: " + transitions);
  if (examples < 1) throw new Error("no examples");
  console.log(`whatif report: ${later} bar(s), ${examples} example(s)`);
} finally {
  await browser.close();
}
