//! Outbound HTTP: the one way timeoutd builds a client for a peer it calls (webhooks, alert
//! receivers, the payment provider, the doctor's probes) and the one reading of what the peer
//! answered.
//!
//! The rules, each the answer to a failure seen in the field:
//! - **Every request has a deadline.** A client from [`client`] gives up on connecting after
//!   [`CONNECT_TIMEOUT`] (or the whole deadline, when shorter) and on the whole exchange —
//!   headers and body, so a peer trickling one byte a second is cut off too — after the
//!   deadline its caller passes (`payment.timeout`, a channel's `timeout`, `alerts.timeout`).
//! - **Redirects are never followed.** reqwest, like browsers, follows a 301/302/303 as a
//!   body-less `GET`: a webhook answering `302 /login` and a provider answering
//!   `303 /v1/payments/{ref}` turned notices and payment closes into GETs of another page, and
//!   the 200 of that page settled the ledger rows as delivered (formancehq/ledger#1990). An
//!   effect is only delivered when the endpoint that was called says so, so a 3xx is an error
//!   naming its `Location` — retried as the ledger retries, since a moved endpoint is an
//!   operator's fix — and `timeoutd doctor` warns about it. Point the URL at the final
//!   endpoint.
//! - **Only a 2xx from the endpoint called settles.** 408, 429 and 5xx are worth a retry; a 429
//!   or 503 with `Retry-After` (RFC 9110 §10.2.3: delay-seconds or an HTTP-date, read against
//!   the answer's own `Date`) is retried no sooner than it asks, up to [`MAX_RETRY_AFTER`];
//!   every other answer is refused as it is.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{DATE, LOCATION, RETRY_AFTER};

/// Connecting to a peer may take at most this long (or the request's whole deadline, when
/// shorter): an address that swallows SYNs costs seconds, not the deadline of every request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest `Retry-After` honoured (1 hour): a peer asking for more is retried after this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// A client that never follows a redirect and gives every request `deadline` (connect,
/// headers and body), connecting within [`CONNECT_TIMEOUT`].
///
/// # Errors
/// A message naming `what` (e.g. `payment`) when the TLS backend cannot be set up.
pub fn client(what: &str, deadline: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT.min(deadline))
        .timeout(deadline)
        .build()
        .map_err(|e| format!("{what} http client: {e}"))
}

/// What an answer means for the call that got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A 2xx from the endpoint called: delivered.
    Delivered,
    /// Worth another try: 3xx (naming its `Location`), 408, 429, 5xx. `after` is the peer's
    /// `Retry-After` when it gave one (capped at [`MAX_RETRY_AFTER`]).
    Retry {
        /// `{url}: HTTP {status}` and, for a redirect, where it pointed.
        reason: String,
        /// The least wait the peer asked for.
        after: Option<Duration>,
    },
    /// Any other answer (4xx): retrying sends the same request to the same refusal.
    Refused(String),
}

/// Reads `status` and `headers` of the answer `url` gave.
pub fn judge(url: &str, status: StatusCode, headers: &reqwest::header::HeaderMap) -> Verdict {
    if status.is_success() {
        return Verdict::Delivered;
    }
    if status.is_redirection() {
        let location = headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(no Location header)");
        return Verdict::Retry {
            reason: format!(
                "{url}: HTTP {status} redirect to {location}: timeoutd does not follow redirects \
                 (a redirected POST arrives as a body-less GET); set the URL to the endpoint itself"
            ),
            after: None,
        };
    }
    let code = status.as_u16();
    if status.is_server_error() || code == 408 || code == 429 {
        return Verdict::Retry {
            reason: format!("{url}: HTTP {status}"),
            after: retry_after(headers),
        };
    }
    Verdict::Refused(format!("{url}: HTTP {status}"))
}

/// The wait a `Retry-After` header asks for: delay-seconds, or an HTTP-date less the answer's
/// own `Date` (no `Date`: not honoured, since the host's clock is not the peer's). Capped at
/// [`MAX_RETRY_AFTER`]; `None` when absent or unreadable.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            let now = httpdate::parse_http_date(headers.get(DATE)?.to_str().ok()?).ok()?;
            at.duration_since(now).unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(reqwest::header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn a_redirect_is_a_retry_naming_its_location_never_delivered() {
        for code in [301, 302, 303, 307, 308] {
            let v = judge(
                "http://hook/n",
                StatusCode::from_u16(code).unwrap(),
                &headers(&[(LOCATION, "/login")]),
            );
            match v {
                Verdict::Retry { reason, after } => {
                    assert!(reason.contains("redirect to /login"), "{reason}");
                    assert_eq!(after, None);
                }
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date_against_the_answers_own_date() {
        let v = judge(
            "u",
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[(RETRY_AFTER, "30")]),
        );
        assert!(matches!(v, Verdict::Retry { after: Some(d), .. } if d == Duration::from_secs(30)));
        let dated = headers(&[
            (RETRY_AFTER, "Sun, 06 Dec 2026 00:02:00 GMT"),
            (DATE, "Sun, 06 Dec 2026 00:00:30 GMT"),
        ]);
        assert_eq!(retry_after(&dated), Some(Duration::from_secs(90)));
        // No Date to read the date against: not honoured.
        let undated = headers(&[(RETRY_AFTER, "Sun, 06 Dec 2026 00:02:00 GMT")]);
        assert_eq!(retry_after(&undated), None);
        // A year is capped at an hour.
        let far = headers(&[(RETRY_AFTER, "31536000")]);
        assert_eq!(retry_after(&far), Some(MAX_RETRY_AFTER));
        assert!(matches!(
            judge("u", StatusCode::NOT_FOUND, &HeaderMap::new()),
            Verdict::Refused(_)
        ));
        assert_eq!(
            judge("u", StatusCode::NO_CONTENT, &HeaderMap::new()),
            Verdict::Delivered
        );
    }
}
