// Drives the timeoutd console in headless Chromium: load, sign in with a token, find the
// overdue order, pause its merchant (the order shows as paused, its Close button disabled),
// resume it, close the order (accepting the confirmations), and see it CLOSED.
// Usage: node console.test.mjs BASE_URL TOKEN ORDER_ID MERCHANT  (exit 0 on success)
import { chromium } from "playwright-core";

const [base, token, orderId, merchant] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  page.on("dialog", (dialog) => dialog.accept());
  await page.goto(base + "/console");
  await page.fill("#token", token);
  await page.click("#signin-button");
  const row = page.locator(`#overdue tr[data-order="${orderId}"]`);
  await row.waitFor({ timeout: 10000 });
  await page.selectOption("#pause-scope", "merchants");
  await page.fill("#pause-target", merchant);
  await page.fill("#pause-reason", "console test");
  await page.click("#pause-button");
  const pause = page.locator(`#pauses tr[data-pause="merchant:${merchant}"]`);
  await pause.waitFor({ timeout: 10000 });
  await row.locator("td", { hasText: "merchant" }).waitFor({ timeout: 10000 });
  if (!(await row.locator("button.close-order").isDisabled())) {
    throw new Error("a paused order's Close button is offered");
  }
  await pause.locator("button.resume").click();
  await pause.waitFor({ state: "detached", timeout: 10000 });
  await row.locator("button.close-order:enabled").click();
  await page.waitForFunction(
    (id) => document.getElementById("order-status").textContent === `Order ${id} is CLOSED`,
    orderId, { timeout: 10000 });
  await page.locator(`#overdue tr[data-order="${orderId}"]`).waitFor({ state: "detached", timeout: 10000 });
  console.log("console: closed " + orderId);
} finally {
  await browser.close();
}
