//! The page shell every console page shares (head, navigation with the
//! sign-out form, main), the answers that are not pages (redirects), the
//! error pages, and the headers every answer carries: no caching, no
//! framing, and a content policy that runs only our own script and style.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::session::Session;

/// Which navigation entry is the current page.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Messages,
    Webhooks,
    None,
}

/// A whole page: `title`, the signed-in `session` (navigation and
/// sign-out), and the `main` content.
pub(super) fn page(title: &str, session: Option<&Session>, nav: Nav, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · smtp-once" }
                link rel="stylesheet" href="/console/static/console.css";
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    span.brand { "smtp-once" }
                    @if let Some(s) = session {
                        nav aria-label="Console" {
                            ul {
                                li { a href="/console/" aria-current=[current(nav, Nav::Overview)] { "Overview" } }
                                li { a href="/console/messages" aria-current=[current(nav, Nav::Messages)] { "Messages" } }
                                @if s.operator {
                                    li { a href="/console/webhooks" aria-current=[current(nav, Nav::Webhooks)] { "Webhooks" } }
                                }
                            }
                        }
                        form.signout method="post" action="/console/logout" {
                            span.who {
                                (s.name())
                                @if s.operator { " (operator)" } @else { " · " (s.account.workspace) }
                            }
                            input type="hidden" name="csrf" value=(s.csrf);
                            button #sign-out type="submit" { "Sign out" }
                        }
                    }
                }
                main #main { (main) }
            }
        }
    }
}

fn current(nav: Nav, this: Nav) -> Option<&'static str> {
    (nav == this).then_some("page")
}

/// An HTML answer with the console's headers.
pub(super) fn html_response(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure_headers(h);
    response
}

/// Headers on every console answer.
pub(super) fn secure_headers(h: &mut axum::http::HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the
    // console's own form posts, and the sign-in's Origin check refuses them.
    // `same-origin` still tells no other site the console's URLs.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
}

/// `303 See Other` to `location` (a console path we built).
pub(super) fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(location) {
        h.insert(header::LOCATION, v);
    }
    secure_headers(h);
    response
}

/// A page that only says what went wrong, with `status`.
pub(super) fn error_page(
    status: StatusCode,
    session: Option<&Session>,
    title: &str,
    text: &str,
) -> Response {
    html_response(
        status,
        page(
            title,
            session,
            Nav::None,
            html! {
                h1 { (title) }
                p.error role="alert" { (text) }
                @if session.is_some() { p { a href="/console/" { "Back to the overview" } } }
            },
        ),
    )
}

/// The same page for a message that does not exist and for one of
/// another workspace: nothing tells them apart.
pub(super) fn not_found(session: Option<&Session>) -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        session,
        "Not found",
        "There is no such page or message.",
    )
}

pub(super) fn forbidden(session: Option<&Session>) -> Response {
    error_page(
        StatusCode::FORBIDDEN,
        session,
        "Forbidden",
        "Forbidden: bad or missing form token",
    )
}

pub(super) fn unavailable(session: Option<&Session>) -> Response {
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        session,
        "Unavailable",
        "The queue cannot be read right now; try again in a moment.",
    )
}

/// A banned address: refused as the API refuses it (`429`, `Retry-After`).
pub(super) fn banned() -> Response {
    let mut response = error_page(
        StatusCode::TOO_MANY_REQUESTS,
        None,
        "Too many failures",
        "Too many authentication failures from your address; try again later.",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
    response
}

/// Milliseconds since the epoch as `2026-12-03T10:00:00.000Z`, in a
/// `<time>` element.
pub(super) fn time(ms: i64) -> Markup {
    let text = crate::time::rfc3339_millis(ms);
    html! { time datetime=(text) { (text) } }
}

/// A duration in words a person reads at a glance (`3 min`, `2 h 5 min`).
pub(super) fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `text` as one URL path segment: every byte but the unreserved ones
/// percent-encoded (an endpoint's name is the operator's free text).
pub(super) fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_segment_is_percent_encoded() {
        assert_eq!(super::segment("ops-1_a.b~"), "ops-1_a.b~");
        assert_eq!(super::segment("a/b c?é"), "a%2Fb%20c%3F%C3%A9");
    }
}
