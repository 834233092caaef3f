// Drives the console's shadow section in headless Chromium: sign in, find the merchant's
// shadow, see its chart draw the differing minute and its latest differing order with both
// answers side by side. Optionally saves a screenshot of the section.
// Usage: node shadow.test.mjs BASE_URL TOKEN MERCHANT ORDER_ID [SCREENSHOT.png]  (exit 0 on success)
import { chromium } from "playwright-core";

const [base, token, merchant, orderId, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  await page.goto(base + "/console");
  await page.fill("#token", token);
  await page.click("#signin-button");
  const view = page.locator(`.shadow[data-merchant="${merchant}"]`);
  await view.waitFor({ timeout: 10000 });
  const bars = await view.locator("svg.shadow-chart rect.differ").count();
  if (bars < 1) throw new Error("no differ bar drawn");
  const counts = await view.locator(".shadow-counts").textContent();
  if (!counts.includes("differ") || !counts.includes("kind")) throw new Error("counts read: " + counts);
  const row = view.locator("tr.shadow-row", { hasText: orderId });
  await row.waitFor({ timeout: 10000 });
  const answers = await row.locator("pre").allTextContents();
  if (answers.length !== 2 || !answers[0].includes('"cancel"') || !answers[1].includes('"wait"')) {
    throw new Error("both answers side by side, live then shadow: " + JSON.stringify(answers));
  }
  if (screenshot) await view.screenshot({ path: screenshot });
  console.log(`console: ${merchant}'s shadow shows ${bars} differ bar(s) and ${orderId}`);
} finally {
  await browser.close();
}
