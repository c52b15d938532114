// The console in a real browser: Debian's chromium driven by playwright-core
// against a running smtp-once daemon (tests/console_browser.rs starts it,
// fills it, and runs this script). Every step asserts; the first failure
// prints what was expected and where, and exits 1.
//
// Environment (all required):
//   CONSOLE_URL          the HTTP listener, e.g. http://127.0.0.1:8025
//   CONSOLE_SHOTS        directory for the PNG screenshots (created)
//   CONSOLE_KEY          the idempotency key of a deferred message of ACCOUNT_1
//   CONSOLE_ACCOUNT_1    account:password of a workspace account
//   CONSOLE_ACCOUNT_2    account:password of another workspace's account
//   CONSOLE_OPERATOR     account:password of an operator account
//   CONSOLE_API_TOKEN_1  ACCOUNT_1's API key, and CONSOLE_API_FROM_1 a sender
//                       it may use (the phone pass submits a message and
//                       waits for the open list to show it)
// Optional: CONSOLE_CHROMIUM (default /usr/bin/chromium), CONSOLE_LABEL
// (a prefix for the screenshots' names, e.g. "pg-"), CONSOLE_CORE_ONLY=1
// (skip the operator pages and the phone pass; no API key needed).
//
// Prints `RESULT {json}` last: the message's queue id and the screenshots.

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`browser.mjs: ${name} is not set`);
    process.exit(2);
  }
  return v;
}

function account(name) {
  const v = need(name);
  const at = v.indexOf(":");
  return { name: v.slice(0, at), password: v.slice(at + 1) };
}

const base = need("CONSOLE_URL").replace(/\/$/, "");
const shots = need("CONSOLE_SHOTS");
const key = need("CONSOLE_KEY");
const first = account("CONSOLE_ACCOUNT_1");
const second = account("CONSOLE_ACCOUNT_2");
const operator = account("CONSOLE_OPERATOR");
const executablePath = process.env.CONSOLE_CHROMIUM || "/usr/bin/chromium";
const label = process.env.CONSOLE_LABEL || "";
const coreOnly = process.env.CONSOLE_CORE_ONLY === "1";
// For the phone pass's refresh check (not needed with CONSOLE_CORE_ONLY=1).
const apiToken = coreOnly ? "" : need("CONSOLE_API_TOKEN_1");
const apiFrom = coreOnly ? "" : need("CONSOLE_API_FROM_1");
mkdirSync(shots, { recursive: true });

let step = "start";
const taken = [];
const problems = []; // page errors and console errors (a CSP refusal included)

class Failed extends Error {}

function check(ok, what) {
  if (!ok) {
    throw new Failed(`${what}`);
  }
}

function path(p) {
  return new URL(p, base).pathname;
}

async function shot(page, name, fullPage = true) {
  const file = join(shots, `${label}${name}.png`);
  await page.screenshot({ path: file, fullPage });
  taken.push(file);
}

/// Watches a page for script errors and console errors (a refused
/// stylesheet or script under the content policy shows as one).
function watch(page) {
  page.on("pageerror", (e) => problems.push(`page error on ${page.url()}: ${e.message}`));
  page.on("console", (m) => {
    // The 401/403/404 pages the test asks for on purpose log a failed load.
    if (m.type() === "error" && !/status of (401|403|404)/.test(m.text())) {
      problems.push(`console error on ${page.url()}: ${m.text()}`);
    }
  });
  return page;
}

/// Submits a message as ACCOUNT_1 through the HTTP API; its queue id.
async function submit(key) {
  const to = "ann@example.net";
  const r = await fetch(`${base}/v1/messages?from=${encodeURIComponent(apiFrom)}&to=${encodeURIComponent(to)}`, {
    method: "POST",
    headers: { Authorization: `Bearer ${apiToken}`, "Idempotency-Key": key, "Content-Type": "message/rfc822" },
    body: `From: <${apiFrom}>\r\nTo: <${to}>\r\nSubject: Submitted while the list is open\r\n\r\nHello.\r\n`,
  });
  const text = await r.text();
  check(r.status === 202, `the API answered ${r.status} to a submission: ${text}`);
  return JSON.parse(text).id;
}

async function signIn(page, who, { keyboard = false } = {}) {
  step = `sign in as ${who.name}`;
  const r = await page.goto(`${base}/console/login`);
  check(r.status() === 200, `GET /console/login answered ${r.status()}`);
  check(await page.locator("form#login").isVisible(), "no form#login on the sign-in page");
  if (keyboard) {
    // Keyboard only: focus the first field, type, Tab, type, Enter.
    await page.focus("#account");
    await page.keyboard.type(who.name);
    await page.keyboard.press("Tab");
    await page.keyboard.type(who.password);
    await page.keyboard.press("Enter");
  } else {
    await page.fill("input[name=account]", who.name);
    await page.fill("input[name=password]", who.password);
    await page.click("button#sign-in");
  }
  await page.waitForURL(`${base}/console/`);
  const who_text = await page.locator("form.signout .who").innerText();
  check(who_text.includes(who.name), `signed in, but the header says "${who_text}", not ${who.name}`);
}

async function stateOf(page) {
  return (await page.locator("#state").innerText()).trim();
}

/// Opens the confirmation page of `action` from the message page, checks
/// it, optionally screenshots it, confirms, and returns the notice.
async function act(page, id, action, screenshot) {
  step = `${action} message ${id}`;
  await page.click(`a#action-${action}`);
  await page.waitForURL(`${base}/console/messages/${id}/${action}`);
  check(await page.locator("form#confirm").count() === 1, `no form#confirm on the ${action} confirmation page`);
  const csrf = await page.locator("form#confirm input[name=csrf]").getAttribute("value");
  const idem = await page.locator("form#confirm input[name=idempotency_key]").getAttribute("value");
  check(csrf && idem, "the confirmation form lacks its csrf or idempotency_key field");
  if (screenshot) await shot(page, screenshot);
  await page.click("button#confirm");
  await page.waitForURL((u) => u.pathname === `/console/messages/${id}` && u.searchParams.get("done") === action);
  const notice = await page.locator("p.notice").innerText();
  return notice;
}

/// A POST without the form token, from the signed-in page itself (so the
/// session cookie goes with it): its status and text.
async function forgedPost(page, to, fields) {
  return page.evaluate(
    async ({ to, fields }) => {
      const r = await fetch(to, {
        method: "POST",
        headers: { "Content-Type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(fields).toString(),
        credentials: "same-origin",
        redirect: "manual",
      });
      return { status: r.status, text: await r.text() };
    },
    { to, fields },
  );
}

async function run(browser) {
  // ---- the first workspace's account, desktop
  const desk = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = watch(await desk.newPage());

  step = "unauthenticated";
  await page.goto(`${base}/console/messages`);
  check(path(page.url()) === "/console/login", `an unauthenticated GET of the list ended at ${page.url()}, not the sign-in page`);
  await shot(page, "login", false);

  step = "wrong password";
  await page.fill("input[name=account]", first.name);
  await page.fill("input[name=password]", "not-the-password");
  await page.click("button#sign-in");
  await page.waitForLoadState();
  check((await page.locator("p.error").innerText()).includes("Sign-in failed"), "a wrong password did not say Sign-in failed");

  await signIn(page, first);
  await shot(page, "overview-workspace");

  step = "message list";
  await page.click("nav a[href='/console/messages']");
  await page.waitForURL(`${base}/console/messages`);
  const all = await page.locator("table#messages tr.message").count();
  check(all >= 2, `the list shows ${all} messages, expected the test's messages`);
  await shot(page, "list");

  step = "filter by key";
  await page.fill("form#filter input[name=key]", key);
  await page.click("form#filter button[type=submit]");
  await page.waitForURL((u) => u.pathname === "/console/messages" && u.searchParams.get("key") === key);
  const rows = page.locator("table#messages tr.message");
  check(await rows.count() === 1, `the key filter shows ${await rows.count()} rows, expected 1`);
  const id = await rows.first().getAttribute("data-id");
  check(id, "the row has no data-id");
  check(await page.inputValue("form#filter input[name=key]") === key, "the filter form lost the key");
  await shot(page, "list-by-key");

  step = "open the message";
  await rows.first().locator("a.message-link").click();
  await page.waitForURL(`${base}/console/messages/${id}`);
  check((await page.locator("h1").innerText()).includes(id), "the message page's heading lacks its id");
  check((await page.locator("#key").innerText()).trim() === key, "the message page shows another key");
  check(await page.locator("dl#envelope").isVisible(), "no dl#envelope");
  check((await page.locator("pre#headers").innerText()).includes("Subject:"), "pre#headers lacks the Subject header");
  check(await page.locator("pre#body").count() === 0, "a workspace account sees the body");
  check(await page.locator("#ledger-expires").count() === 1, "no ledger entry with its expiry");
  const before = await stateOf(page);
  check(before === "deferred", `the message is ${before}, expected deferred (its next hop greylists it)`);

  step = "attempts table";
  const attempts = page.locator("table#attempts tbody tr");
  check(await attempts.count() >= 1, "table#attempts has no row");
  const attempt = await attempts.first().innerText();
  check(/451/.test(attempt), `the first attempt does not show the next hop's 451 reply: ${attempt}`);
  await shot(page, "message");

  step = "forged POST without the form token";
  const forged = await forgedPost(page, `/console/messages/${id}/hold`, { idempotency_key: "forged-1" });
  check(forged.status === 403, `a POST without csrf answered ${forged.status}, expected 403`);
  check(forged.text.includes("Forbidden: bad or missing form token"), "the 403 page does not say why");
  const wrong = await forgedPost(page, `/console/messages/${id}/hold`, { csrf: "0".repeat(64), idempotency_key: "forged-2" });
  check(wrong.status === 403, `a POST with a wrong csrf answered ${wrong.status}, expected 403`);
  // The same as a plain HTML form (a page's own form, stripped of the
  // token), so the 403 page is seen and kept.
  await page.evaluate((to) => {
    const f = document.createElement("form");
    f.method = "post";
    f.action = to;
    const k = document.createElement("input");
    k.name = "idempotency_key";
    k.value = "forged-3";
    f.appendChild(k);
    document.body.appendChild(f);
    f.submit();
  }, `/console/messages/${id}/hold`);
  await page.waitForURL(`${base}/console/messages/${id}/hold`);
  check((await page.locator("p.error").innerText()).includes("Forbidden"), "the forged form's answer is not the Forbidden page");
  await shot(page, "forbidden", false);
  await page.goto(`${base}/console/messages/${id}`);
  check(await stateOf(page) === "deferred", `after the forged posts the message is ${await stateOf(page)}, not deferred`);

  step = "hold";
  const held = await act(page, id, "hold", "confirm-hold");
  check(held.startsWith("Held"), `the notice after hold says "${held}"`);
  check(await stateOf(page) === "held", `after hold the state is ${await stateOf(page)}`);
  await shot(page, "message-held");

  step = "release";
  const released = await act(page, id, "release", null);
  check(released.startsWith("Released"), `the notice after release says "${released}"`);
  const after = await stateOf(page);
  check(after !== "held", `after release the state is still ${after}`);

  step = "webhook events on the message page";
  // The events are written with the action and sent by the outbox's
  // worker: reload until both are listed and delivered (at most 30 s).
  const deadline = Date.now() + 30_000;
  let seen = "";
  for (;;) {
    const rowsNow = await page.locator("table#events tr.event").evaluateAll((trs) =>
      trs.map((tr) => `${tr.dataset.type}=${tr.cells[3].innerText.trim()}`),
    );
    seen = rowsNow.join(", ");
    if (rowsNow.includes("message.held=delivered") && rowsNow.includes("message.released=delivered")) break;
    check(Date.now() < deadline, `after 30 s the events table shows [${seen}], expected message.held and message.released delivered`);
    await page.waitForTimeout(500);
    await page.reload();
  }
  await shot(page, "message-events");
  // The events section alone, for the docs.
  const events = join(shots, `${label}events.png`);
  await page.locator("section", { has: page.locator("table#events") }).screenshot({ path: events });
  taken.push(events);

  step = "sign out";
  await page.click("button#sign-out");
  await page.waitForURL(`${base}/console/login`);
  await page.goto(`${base}/console/messages/${id}`);
  check(path(page.url()) === "/console/login", `after sign-out the message page is ${page.url()}, not the sign-in page`);

  // ---- the second workspace (by keyboard)
  await signIn(page, second, { keyboard: true });
  step = `${second.name} lists the messages`;
  await page.goto(`${base}/console/messages`);
  check(await page.locator(`tr.message[data-id="${id}"]`).count() === 0, `${second.name} sees ${first.name}'s message in the list`);
  await page.goto(`${base}/console/messages?key=${encodeURIComponent(key)}`);
  check(await page.locator("tr.message").count() === 0, `${second.name} finds ${first.name}'s message by its key`);
  step = `${second.name} opens the other workspace's message`;
  const theirs = await page.goto(`${base}/console/messages/${id}`);
  check(theirs.status() === 404, `${second.name} got ${theirs.status()} for another workspace's message, expected 404`);
  const theirsText = await page.locator("main").innerText();
  await shot(page, "not-found", false);
  const missing = await page.goto(`${base}/console/messages/NOSUCHMESSAGE00`);
  check(missing.status() === 404, `a missing message answered ${missing.status()}`);
  check((await page.locator("main").innerText()) === theirsText, "the 404 page of another workspace's message differs from a missing one's");
  const confirmTheirs = await page.goto(`${base}/console/messages/${id}/cancel`);
  check(confirmTheirs.status() === 404, `${second.name} got ${confirmTheirs.status()} for a confirmation page of another workspace's message`);
  step = `${second.name} posts without the form token`;
  const forged2 = await forgedPost(page, `/console/messages/${id}/cancel`, { idempotency_key: "forged-4" });
  check(forged2.status === 403, `${second.name}'s POST without csrf answered ${forged2.status}, expected 403`);

  // ---- a cross-site form: the SameSite=Strict cookie stays home
  step = "cross-site form post";
  await page.goto(`${base}/console/messages`);
  const ownCsrf = await page.locator("form.signout input[name=csrf]").getAttribute("value");
  const other = watch(await desk.newPage());
  await other.setContent(
    `<form id="x" method="post" action="${base}/console/messages/${id}/cancel">` +
      `<input name="csrf" value="${ownCsrf}"><input name="idempotency_key" value="forged-5"></form>`,
  );
  await other.evaluate(() => document.getElementById("x").submit());
  await other.waitForLoadState();
  check(path(other.url()) !== `/console/messages/${id}`, `a cross-site form reached the message page (${other.url()})`);
  await other.close();
  await page.click("button#sign-out");
  await page.waitForURL(`${base}/console/login`);

  step = "the message after the other workspace's attempts";
  await signIn(page, first);
  await page.goto(`${base}/console/messages/${id}`);
  const finalState = await stateOf(page);
  check(finalState !== "cancelled" && finalState !== "held", `the other workspace's posts changed the message: ${finalState}`);
  await page.click("button#sign-out");
  await page.waitForURL(`${base}/console/login`);

  if (!coreOnly) {
    // ---- the operator: overview and webhooks
    await signIn(page, operator);
    step = "operator overview";
    for (const part of ["section#rates", "svg#chart", "table#queue-depth", "p#oldest-queued", "section#auth", "table#webhook-endpoints"]) {
      check(await page.locator(part).count() === 1, `the overview lacks ${part}`);
    }
    await shot(page, "overview");
    step = "operator webhooks";
    await page.click("nav a[href='/console/webhooks']");
    await page.waitForURL(`${base}/console/webhooks`);
    check(await page.locator("table#endpoints tbody tr").count() >= 1, "table#endpoints has no row");
    check((await page.locator("table#deliveries").innerText()).includes("message.held"), "table#deliveries lacks message.held");
    await shot(page, "webhooks");
    step = "operator sees the body on request";
    await page.goto(`${base}/console/messages/${id}`);
    await page.click("a#show-body");
    check((await page.locator("pre#body").innerText()).length > 0, "no pre#body for the operator");
    await page.click("button#sign-out");
    await page.waitForURL(`${base}/console/login`);

    // ---- a phone
    const phone = await browser.newContext({
      viewport: { width: 390, height: 844 },
      deviceScaleFactor: 1,
      isMobile: true,
      hasTouch: true,
    });
    const p = watch(await phone.newPage());
    await signIn(p, first);
    step = "phone list";
    await p.goto(`${base}/console/messages`);
    check(await p.locator(`tr.message[data-id="${id}"]`).count() === 1, "the phone's list lacks the message");
    const wide = await p.evaluate(() => document.documentElement.scrollWidth);
    check(wide <= 390 + 1, `the list page is ${wide} px wide on a 390 px screen (the page scrolls sideways)`);
    await shot(p, "phone-list", false);
    step = "phone list refreshes itself";
    // A message submitted now (through the API) shows up in the open list
    // by the page's own refresh, without a reload.
    await p.evaluate(() => {
      window.__notReloaded = true;
    });
    const fresh = await submit(`refresh-${Date.now()}`);
    const refreshed = await p.waitForResponse((r) => r.url().includes("fragment=1"), { timeout: 15_000 });
    check(refreshed.status() === 200, `the list's refresh answered ${refreshed.status()}`);
    await p.locator(`tr.message[data-id="${fresh}"]`).waitFor({ timeout: 25_000 });
    check(await p.evaluate(() => window.__notReloaded === true), "the list was reloaded, not refreshed in place");
    step = "phone message";
    await p.locator(`tr.message[data-id="${id}"] a.message-link`).click();
    await p.waitForURL(`${base}/console/messages/${id}`);
    const wideMsg = await p.evaluate(() => document.documentElement.scrollWidth);
    check(wideMsg <= 390 + 1, `the message page is ${wideMsg} px wide on a 390 px screen (the page scrolls sideways)`);
    await shot(p, "phone-message", false);
    await phone.close();
  }
  await desk.close();
  check(problems.length === 0, `the browser reported:\n  ${problems.join("\n  ")}`);
  return id;
}

const browser = await chromium.launch({ executablePath, headless: true });
let code = 0;
try {
  const id = await run(browser);
  console.log(`RESULT ${JSON.stringify({ id, screenshots: taken })}`);
} catch (e) {
  const what = e instanceof Failed ? e.message : e.stack || String(e);
  console.error(`browser.mjs: FAILED at step "${step}": ${what}`);
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
