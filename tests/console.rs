//! Issue 25: the web console against the real daemon, attacker first: no
//! page without a session (a forged cookie included), one answer for every
//! failed sign-in, counted in the AUTH throttle until the address is
//! banned, cookie flags, CSRF on every form, a bounded form body, another
//! workspace's message a 404 page, escaped header text, and hold/release
//! through confirmation pages with their webhook events and a replayed
//! confirmation that acts once. The core flow runs on SQLite and on
//! PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::http::{Request, Response, submit_raw};
use common::pg::TestDb;
use common::webhook::{Receiver, closed_port, endpoint_toml, secret};
use common::{Daemon, Options, Store, api_token, operator_user, wait_until};

const FORM: &str = "application/x-www-form-urlencoded";

/// A daemon with the console on, its next hop refusing connections (each
/// message is deferred for an hour after its first attempt).
fn daemon(store: Store, webhook: Option<&Receiver>, auth: &str) -> Daemon {
    let hooks = webhook.map_or(String::new(), |r| {
        endpoint_toml(
            "ops",
            &r.url(),
            &secret(9),
            "events = [\"message.held\", \"message.released\"]",
        )
    });
    Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{}\"\ntls = \"none\"\n\
             retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n",
            closed_port()
        )),
        extra: format!(
            "[http]\naddr = \"127.0.0.1:0\"\nconsole = true\n{hooks}{}",
            operator_user()
        ),
        auth_extra: auth.into(),
        store,
        ..Options::default()
    })
}

fn cookies(r: &Response) -> Vec<&str> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect()
}

fn cookie_value(r: &Response, name: &str) -> Option<String> {
    cookies(r).iter().find_map(|c| {
        c.split(';')
            .next()
            .and_then(|p| p.split_once('='))
            .filter(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.to_owned())
    })
}

fn text(r: &Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The value of the hidden input `name` in a page.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[at..].split('"').next().expect("value").to_owned()
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish().into_bytes()
}

/// A signed-in browser: its session cookie and form token.
struct Browser {
    cookie: String,
    csrf: String,
}

impl Browser {
    async fn get(&self, http: SocketAddr, path: &str) -> Response {
        Request::new("GET", path)
            .header("Cookie", &self.cookie)
            .send(http)
            .await
    }

    async fn post(&self, http: SocketAddr, path: &str, pairs: &[(&str, &str)]) -> Response {
        Request::new("POST", path)
            .header("Cookie", &self.cookie)
            .body(FORM, &form(pairs))
            .send(http)
            .await
    }

    /// Confirms `action` on `id`: the confirmation page's key, then its
    /// form posted; both answers.
    async fn act(&self, http: SocketAddr, id: &str, action: &str) -> (String, Response) {
        let path = format!("/console/messages/{id}/{action}");
        let page = self.get(http, &path).await;
        assert_eq!(page.status, 200, "{}", text(&page));
        let page = text(&page);
        assert!(page.contains("id=\"confirm\""), "{page}");
        let key = hidden(&page, "idempotency_key");
        let r = self
            .post(
                http,
                &path,
                &[
                    ("csrf", self.csrf.as_str()),
                    ("idempotency_key", key.as_str()),
                ],
            )
            .await;
        (key, r)
    }
}

/// The sign-in form's pre-session cookie and token.
async fn login_form(http: SocketAddr) -> (String, String) {
    let r = Request::new("GET", "/console/login").send(http).await;
    assert_eq!(r.status, 200);
    let page = text(&r);
    assert!(page.contains("id=\"login\"") && page.contains("for=\"password\""));
    let token = cookie_value(&r, "smtp_once_console_login").expect("login cookie");
    assert_eq!(hidden(&page, "csrf"), token);
    (format!("smtp_once_console_login={token}"), token)
}

async fn sign_in_with(http: SocketAddr, pairs: &[(&str, &str)]) -> Response {
    let (cookie, token) = login_form(http).await;
    let mut all = vec![("csrf", token.as_str())];
    all.extend_from_slice(pairs);
    Request::new("POST", "/console/login")
        .header("Cookie", &cookie)
        .body(FORM, &form(&all))
        .send(http)
        .await
}

async fn sign_in(http: SocketAddr, pairs: &[(&str, &str)]) -> Browser {
    let r = sign_in_with(http, pairs).await;
    assert_eq!(r.status, 303, "{}", text(&r));
    assert_eq!(r.header("location"), Some("/console/"));
    let token = cookie_value(&r, "smtp_once_console").expect("session cookie");
    let cookie = format!("smtp_once_console={token}");
    let page = Request::new("GET", "/console/messages")
        .header("Cookie", &cookie)
        .send(http)
        .await;
    assert_eq!(page.status, 200, "{}", text(&page));
    let csrf = hidden(&text(&page), "csrf");
    Browser { cookie, csrf }
}

async fn submit(http: SocketAddr, subject: &str, key: &str) -> String {
    let message = format!(
        "From: Alice <alice@example.test>\r\nTo: r@example.net\r\nSubject: {subject}\r\n\r\nHello.\r\n"
    );
    let envelope = ("alice@example.test", "r@example.net");
    submit_raw(http, "alice", envelope, Some(key), message.as_bytes()).await
}

async fn state_of(http: SocketAddr, id: &str) -> String {
    let r = Request::new("GET", &format!("/v1/messages/{id}"))
        .bearer(&api_token("alice"))
        .send(http)
        .await;
    r.json()["state"].as_str().unwrap_or("").to_owned()
}

async fn wait_state(http: SocketAddr, id: &str, wants: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while state_of(http, id).await != wants {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id}: never {wants}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The core flow on one store.
async fn script(store: Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = Receiver::start(&secret(9), &dir.path().join("hooks.db"), 0, &[]);
    let d = daemon(store, Some(&receiver), "");
    let http = d.http.expect("http listener");

    // No session, a forged one: every page sends to the sign-in page.
    for path in [
        "/console/",
        "/console/messages",
        "/console/messages/X/hold",
        "/console/nope",
    ] {
        let r = Request::new("GET", path).send(http).await;
        assert_eq!(
            (r.status, r.header("location")),
            (303, Some("/console/login")),
            "{path}"
        );
    }
    let forged = Browser {
        cookie: format!("smtp_once_console={}", "ab".repeat(32)),
        csrf: "x".into(),
    };
    let r = forged.get(http, "/console/messages").await;
    assert_eq!(
        (r.status, r.header("location")),
        (303, Some("/console/login"))
    );

    // Failed sign-ins: one answer whatever the cause.
    let wrong_password = sign_in_with(http, &[("account", "alice"), ("password", "nope")]).await;
    let no_account = sign_in_with(http, &[("account", "nobody"), ("password", "nope")]).await;
    let wrong_key = sign_in_with(http, &[("api_key", "so_wrong")]).await;
    for r in [&wrong_password, &no_account, &wrong_key] {
        assert_eq!(r.status, 401);
        assert!(text(r).contains("<p class=\"error\" role=\"alert\">Sign-in failed</p>"));
        assert!(cookie_value(r, "smtp_once_console").is_none());
    }
    // The sign-in form's own protections: its token, and Origin.
    let (cookie, token) = login_form(http).await;
    let no_token = Request::new("POST", "/console/login")
        .header("Cookie", &cookie)
        .body(
            FORM,
            &form(&[("account", "alice"), ("password", "alice-pw")]),
        )
        .send(http)
        .await;
    assert_eq!(no_token.status, 403);
    let other_site = Request::new("POST", "/console/login")
        .header("Cookie", &cookie)
        .header("Origin", "https://evil.example")
        .body(
            FORM,
            &form(&[
                ("csrf", token.as_str()),
                ("account", "alice"),
                ("password", "alice-pw"),
            ]),
        )
        .send(http)
        .await;
    assert_eq!(other_site.status, 403);
    let huge = Request::new("POST", "/console/login")
        .header("Cookie", &cookie)
        .body(FORM, &vec![b'a'; 20 * 1024])
        .send(http)
        .await;
    assert_eq!(huge.status, 413);

    // Sign-in: the cookie's flags (plaintext listener: no Secure).
    let ok = sign_in_with(http, &[("account", "alice"), ("password", "alice-pw")]).await;
    assert_eq!(ok.status, 303);
    let set = cookies(&ok)
        .into_iter()
        .find(|c| c.starts_with("smtp_once_console="))
        .expect("session cookie")
        .to_owned();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(!set.contains("Secure"), "{set}");
    let alice = sign_in(http, &[("account", "alice"), ("password", "alice-pw")]).await;

    // A message whose header and key carry markup.
    let id = submit(http, "<script>alert(1)</script>", "console-<k1>").await;
    wait_state(http, &id, "deferred").await;
    let list = text(&alice.get(http, "/console/messages").await);
    assert!(list.contains(&format!("data-id=\"{id}\"")), "{list}");
    let by_key = text(
        &alice
            .get(http, "/console/messages?key=console-%3Ck1%3E")
            .await,
    );
    assert!(by_key.contains(&format!("data-id=\"{id}\"")));
    let other_key = text(&alice.get(http, "/console/messages?key=console-k2").await);
    assert!(!other_key.contains(&format!("data-id=\"{id}\"")));
    let fragment = alice.get(http, "/console/messages?fragment=1").await;
    assert!(
        text(&fragment).starts_with("<table id=\"messages\""),
        "{}",
        text(&fragment)
    );
    let page = alice.get(http, &format!("/console/messages/{id}")).await;
    assert_eq!(page.status, 200);
    let page = text(&page);
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(!page.contains("<script>alert(1)"));
    assert!(page.contains("console-&lt;k1&gt;") && !page.contains("console-<k1>"));
    for part in [
        "id=\"envelope\"",
        "id=\"headers\"",
        "id=\"ledger-expires\"",
        "id=\"attempts\"",
        "id=\"events\"",
    ] {
        assert!(page.contains(part), "{part}");
    }
    assert!(
        !page.contains("id=\"body\""),
        "no body for a workspace account"
    );

    // Another workspace: the same 404 page as a missing id, not listed,
    // no action.
    let carol_key = api_token("carol");
    let carol = sign_in(http, &[("api_key", carol_key.as_str())]).await;
    let theirs = carol.get(http, &format!("/console/messages/{id}")).await;
    let missing = carol.get(http, "/console/messages/NOSUCHMESSAGE00").await;
    assert_eq!((theirs.status, missing.status), (404, 404));
    assert_eq!(theirs.body, missing.body);
    assert!(!text(&carol.get(http, "/console/messages").await).contains(&id));
    assert_eq!(
        carol
            .get(http, &format!("/console/messages/{id}/hold"))
            .await
            .status,
        404
    );
    let r = carol
        .post(
            http,
            &format!("/console/messages/{id}/hold"),
            &[("csrf", carol.csrf.as_str()), ("idempotency_key", "c1")],
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(carol.get(http, "/console/webhooks").await.status, 404);

    // CSRF: no token, a wrong one, another session's: 403, nothing done.
    let hold = format!("/console/messages/{id}/hold");
    for pairs in [
        vec![("idempotency_key", "x1")],
        vec![("csrf", "0000"), ("idempotency_key", "x2")],
        vec![("csrf", carol.csrf.as_str()), ("idempotency_key", "x3")],
    ] {
        let r = alice.post(http, &hold, &pairs).await;
        assert_eq!(r.status, 403);
        assert!(text(&r).contains("Forbidden: bad or missing form token"));
    }
    let huge = Request::new("POST", &hold)
        .header("Cookie", &alice.cookie)
        .body(FORM, &vec![b'a'; 17 * 1024])
        .send(http)
        .await;
    assert_eq!(huge.status, 413);
    assert_eq!(state_of(http, &id).await, "deferred");

    // Hold through its confirmation, then the same confirmation again:
    // replayed, not acted twice.
    let (key, r) = alice.act(http, &id, "hold").await;
    assert_eq!(r.status, 303, "{}", text(&r));
    assert_eq!(
        r.header("location"),
        Some(format!("/console/messages/{id}?done=hold").as_str())
    );
    assert_eq!(state_of(http, &id).await, "held");
    let (_, released) = alice.act(http, &id, "release").await;
    assert_eq!(released.status, 303);
    // Released: deferred (it had an attempt) and due now.
    assert_ne!(state_of(http, &id).await, "held");
    let again = alice
        .post(
            http,
            &hold,
            &[
                ("csrf", alice.csrf.as_str()),
                ("idempotency_key", key.as_str()),
            ],
        )
        .await;
    assert_eq!(again.status, 303);
    assert_eq!(
        again.header("location"),
        Some(format!("/console/messages/{id}?done=hold&replayed=1").as_str())
    );
    assert_ne!(
        state_of(http, &id).await,
        "held",
        "the replay did not hold it again"
    );
    let notice = text(&alice.get(http, again.header("location").unwrap()).await);
    assert!(notice.contains("class=\"notice\"") && notice.contains("nothing was done again"));
    // A refusal: releasing a message that is not held.
    let (_, refused) = alice.act(http, &id, "release").await;
    assert_eq!(refused.status, 409);
    assert!(text(&refused).contains("class=\"error\""));

    // One held and one released event, with the console as the actor.
    let jobs = wait_until("held and released events", 30, || {
        let jobs = receiver.jobs();
        (jobs.len() >= 2).then_some(jobs)
    })
    .await;
    // Sent concurrently: in either order.
    let mut types: Vec<&str> = jobs.iter().map(|j| j.event_type.as_str()).collect();
    types.sort_unstable();
    assert_eq!(types, ["message.held", "message.released"], "{jobs:?}");
    assert!(
        jobs.iter()
            .all(|j| j.payload["data"]["actor"] == "console:alice")
    );
    assert!(
        jobs.iter()
            .all(|j| j.queue_id.as_deref() == Some(id.as_str()))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.jobs().len(), 2, "the replay caused no event");
    let page = text(&alice.get(http, &format!("/console/messages/{id}")).await);
    assert!(page.contains("message.held") && page.contains("message.released"));

    // Filters by age; paging by cursor, newest first, 50 a page.
    assert!(text(&alice.get(http, "/console/messages?age=1h").await).contains(&id));
    let bad_age = alice.get(http, "/console/messages?age=soon").await;
    assert_eq!(bad_age.status, 400);
    for i in 0..50 {
        submit(http, &format!("page {i}"), &format!("page-{i}")).await;
    }
    let first = text(&alice.get(http, "/console/messages").await);
    assert!(
        !first.contains(&format!("data-id=\"{id}\"")),
        "the oldest is on page 2"
    );
    let marker = "id=\"next-page\" href=\"";
    let at = first.find(marker).expect("a next page") + marker.len();
    let next = first[at..]
        .split('"')
        .next()
        .expect("href")
        .replace("&amp;", "&");
    assert!(next.contains("after="), "{next}");
    let second = text(&alice.get(http, &next).await);
    assert!(second.contains(&format!("data-id=\"{id}\"")), "{second}");
    assert!(!second.contains("id=\"next-page\""));
    // A form posted without a session: to the sign-in page, nothing done.
    let anonymous = Request::new("POST", &hold)
        .body(FORM, &form(&[("csrf", "x"), ("idempotency_key", "a1")]))
        .send(http)
        .await;
    assert_eq!(anonymous.status, 303);

    // The operator: every workspace, the body on request, the overview
    // and webhook pages.
    let olga = sign_in(http, &[("account", "olga"), ("password", "olga-pw")]).await;
    let listed = text(
        &olga
            .get(
                http,
                "/console/messages?workspace=acme&key=console-%3Ck1%3E",
            )
            .await,
    );
    assert!(listed.contains(&id) && listed.contains("name=\"workspace\""));
    let none = text(
        &olga
            .get(
                http,
                "/console/messages?workspace=globex&key=console-%3Ck1%3E",
            )
            .await,
    );
    assert!(!none.contains(&format!("data-id=\"{id}\"")));
    let body = text(
        &olga
            .get(http, &format!("/console/messages/{id}?body=1"))
            .await,
    );
    assert!(body.contains("id=\"body\"") && body.contains("Hello."));
    let overview = text(&olga.get(http, "/console/").await);
    for part in [
        "id=\"rates\"",
        "id=\"chart\"",
        "id=\"queue-depth\"",
        "id=\"oldest-queued\"",
        "id=\"auth\"",
        "id=\"webhook-endpoints\"",
    ] {
        assert!(overview.contains(part), "{part}: {overview}");
    }
    let hooks = olga.get(http, "/console/webhooks").await;
    assert_eq!(hooks.status, 200);
    let hooks = text(&hooks);
    assert!(hooks.contains("id=\"endpoints\"") && hooks.contains("id=\"deliveries\""));
    assert!(hooks.contains("message.held"));
    let css = Request::new("GET", "/console/static/console.css")
        .send(http)
        .await;
    assert_eq!(
        (css.status, css.header("content-type")),
        (200, Some("text/css; charset=utf-8"))
    );

    // Sign-out ends the session for every copy of the cookie.
    let out = alice
        .post(http, "/console/logout", &[("csrf", alice.csrf.as_str())])
        .await;
    assert_eq!(
        (out.status, out.header("location")),
        (303, Some("/console/login"))
    );
    let after = alice.get(http, "/console/messages").await;
    assert_eq!(
        (after.status, after.header("location")),
        (303, Some("/console/login"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_sqlite() {
    script(Store::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_postgres() {
    script(Store::Postgres(Arc::new(TestDb::create()))).await;
}

/// Repeated wrong passwords through the console ban the address on every
/// listener, as SMTP AUTH failures do; the console then refuses it as the
/// API does (429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_ban_the_address() {
    let d = daemon(
        Store::Sqlite,
        None,
        "failure_delay = \"0s\"\nmax_failure_delay = \"0s\"\nmax_failures_per_ip = 3\n",
    );
    let http = d.http.expect("http listener");
    // Until banned: the sign-in answers 401, then 429 (or, once banned,
    // the front door refuses the connection itself).
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let form_page = Request::new("GET", "/console/login").send(http).await;
        if form_page.status != 200 {
            statuses.push(form_page.status);
            break;
        }
        let token = cookie_value(&form_page, "smtp_once_console_login").expect("cookie");
        let r = Request::new("POST", "/console/login")
            .header("Cookie", &format!("smtp_once_console_login={token}"))
            .body(
                FORM,
                &form(&[
                    ("csrf", token.as_str()),
                    ("account", "alice"),
                    ("password", "wrong"),
                ]),
            )
            .send(http)
            .await;
        statuses.push(r.status);
        if r.status != 401 {
            break;
        }
    }
    assert!(
        statuses.len() >= 3 && statuses[..2] == [401, 401],
        "{statuses:?}"
    );
    assert!(matches!(statuses.last(), Some(429 | 503)), "{statuses:?}");
    // The API refuses the address too (the same throttle).
    let api = Request::new("GET", "/v1/messages")
        .bearer(&api_token("alice"))
        .send(http)
        .await;
    assert_ne!(api.status, 200);
}

/// Under TLS the session cookie is `Secure`, and a sign-in whose `Origin`
/// names this listener (https) goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_secure_under_tls() {
    let d = Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\ntls = true\nconsole = true\n".into(),
        store: Store::Sqlite,
        ..Options::default()
    });
    let http = d.http.expect("http listener");
    let page = Request::new("GET", "/console/login").send_tls(http).await;
    assert_eq!(page.status, 200);
    let token = cookie_value(&page, "smtp_once_console_login").expect("login cookie");
    assert!(cookies(&page).iter().all(|c| c.contains("; Secure")));
    // The test client's requests say `Host: test`.
    let origin = "https://test";
    let r = Request::new("POST", "/console/login")
        .header("Cookie", &format!("smtp_once_console_login={token}"))
        .header("Origin", origin)
        .body(
            FORM,
            &form(&[
                ("csrf", token.as_str()),
                ("account", "bob"),
                ("password", "bob-pw"),
            ]),
        )
        .send_tls(http)
        .await;
    assert_eq!(r.status, 303, "{}", text(&r));
    let set = cookies(&r)
        .into_iter()
        .find(|c| c.starts_with("smtp_once_console="))
        .expect("session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/console", "Secure"] {
        assert!(set.contains(flag), "{set}");
    }
}
