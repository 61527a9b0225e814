//! Which requests a policy limits ([`Rule`]), by whose subject and at what cost.
//!
//! A rule matches a request when every condition it has holds: the path is its `path_prefix`
//! or below it (whole segments), the method is one of its methods, the host is its host, and
//! each of its header conditions holds (a header present, or its first value equal to a
//! given one). A condition left out matches everything.
//!
//! The subject is one or more parts ([`SubjectSource`]): a header, the peer `ip`, a path
//! segment, a constant. One part is digested as its raw bytes (the digest every earlier
//! version gave, so existing state keeps its keys); several are composed length-prefixed
//! (each part as a 4-byte big-endian length and its bytes) before the HMAC, so `("ab", "c")`
//! and `("a", "bc")` are different subjects. A composed subject never equals a one-part one:
//! it starts with a NUL byte, which no header value, address, path segment or constant holds.
//! A part the request does not have (no such header, no peer address, no such segment) is
//! empty: as for a one-part subject, leaving it out is never a way around the limit.
//!
//! The cost is fixed ([`CostSource::Fixed`], 1 by default) or read from a header
//! ([`CostSource::Header`]: a whole number 1..=`max_cost`; anything else is answered 400 by
//! the middleware, nothing charged).
//!
//! Reading a request's subject lives here too, in one place for both middlewares: its parts,
//! the peer address through a [`PeerIp`] function, the length check and the digest.
//!
//! [`most_overlapping`] finds the largest group of rules that can all match one request, so
//! that a configuration can be refused when a request could match more than
//! [`MAX_LIMITS`](shared_contract::MAX_LIMITS) of them (one all-or-nothing evaluation takes at
//! most that many limits).

use std::io::Write as _;
use std::net::IpAddr;

use http::{Extensions, HeaderName, HeaderValue, Method, Request, Response};
use shared_contract::{Cost, PolicyId};

use crate::limiter::Limiter;
use crate::problem;
use crate::subject::MAX_SUBJECT_BYTES;
use crate::subject::SubjectSource;

/// A header condition of a rule: `"x-tenant"` (present) or `"x-tier=gold"` (first value
/// equal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderCondition {
    /// The header is present, with any value.
    Present(String),
    /// `(name, value)`: the header's first value is exactly `value`.
    Equals(String, String),
}

impl HeaderCondition {
    /// Parses `"NAME"` or `"NAME=VALUE"` (the name case-insensitive, the value exact).
    ///
    /// # Errors
    /// A message saying what is wrong with `s`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, value) = match s.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (s, None),
        };
        let name = crate::subject::header_name(name)
            .ok_or_else(|| format!("{name:?} is not a valid header name (in {s:?})"))?;
        match value {
            None => Ok(Self::Present(name)),
            Some(v) if HeaderValue::from_str(v).is_ok() => Ok(Self::Equals(name, v.to_owned())),
            Some(v) => Err(format!("{v:?} is not a valid header value (in {s:?})")),
        }
    }

    /// The header's name (lowercased by [`Self::parse`]).
    pub fn name(&self) -> &str {
        match self {
            Self::Present(n) | Self::Equals(n, _) => n,
        }
    }
}

impl std::fmt::Display for HeaderCondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Present(n) => f.write_str(n),
            Self::Equals(n, v) => write!(f, "{n}={v}"),
        }
    }
}

/// Parses an HTTP method name, case-insensitively (`get` is `GET`; an extension method is
/// taken in upper case too).
///
/// # Errors
/// A message naming `s` when it is not a method token.
pub fn parse_method(s: &str) -> Result<Method, String> {
    let upper = s.to_ascii_uppercase();
    let token = !upper.is_empty()
        && upper
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    match Method::from_bytes(upper.as_bytes()) {
        Ok(m) if token => Ok(m),
        _ => Err(format!("{s:?} is not an HTTP method")),
    }
}

/// Where a rule's cost comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// The same cost for every request (`cost = 3`).
    Fixed(Cost),
    /// A request header holding a whole number (`cost = "header:x-cost"`), by lower-case name.
    Header(String),
}

impl CostSource {
    /// Parses `"header:NAME"`.
    ///
    /// # Errors
    /// A message saying what is wrong with `s`.
    pub fn parse_header(s: &str) -> Result<Self, String> {
        let name = s
            .strip_prefix("header:")
            .ok_or_else(|| format!("{s:?} is not a cost; use a whole number or \"header:NAME\""))?;
        crate::subject::header_name(name)
            .map(Self::Header)
            .ok_or_else(|| format!("{name:?} is not a valid header name"))
    }
}

impl std::fmt::Display for CostSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(c) => write!(f, "{}", c.get()),
            Self::Header(h) => write!(f, "header:{h}"),
        }
    }
}

/// A subject part, ready to read from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Header(HeaderName),
    Ip,
    Segment(usize),
    Const(Box<str>),
}

/// The cost, ready to read from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuleCost {
    Fixed(Cost),
    Header(HeaderName),
}

/// Which requests a policy limits, by which subject and at what cost.
#[derive(Debug, Clone)]
pub struct Rule {
    path_prefix: String,
    policy: PolicyId,
    pub(crate) subject: Vec<Part>,
    methods: Vec<Method>,
    host: Option<String>,
    headers: Vec<(HeaderName, Option<HeaderValue>)>,
    /// No condition but the path prefix (the common rule): matching reads the path only.
    path_only: bool,
    pub(crate) cost: RuleCost,
    shadow: bool,
}

/// A header name the parsers accepted; one built by hand that is not a header name can only
/// match nothing.
fn header(name: String) -> HeaderName {
    HeaderName::try_from(name)
        .unwrap_or_else(|_| HeaderName::from_static("x-invalid-subject-header"))
}

fn part(source: SubjectSource) -> Part {
    match source {
        SubjectSource::Header(name) => Part::Header(header(name)),
        SubjectSource::Ip => Part::Ip,
        SubjectSource::PathSegment(i) => Part::Segment(i),
        SubjectSource::Const(c) => Part::Const(c.into()),
    }
}

impl Rule {
    /// A rule for paths equal to `path_prefix` or below it (`/api` matches `/api` and
    /// `/api/x`, not `/apix`), any method, host and headers, with the one-part `subject` and
    /// cost 1.
    pub fn new(path_prefix: impl Into<String>, policy: PolicyId, subject: SubjectSource) -> Self {
        let mut path_prefix = path_prefix.into();
        while path_prefix.len() > 1 && path_prefix.ends_with('/') {
            path_prefix.pop();
        }
        Self {
            path_prefix,
            policy,
            subject: vec![part(subject)],
            methods: Vec::new(),
            host: None,
            headers: Vec::new(),
            path_only: true,
            cost: RuleCost::Fixed(Cost::ONE),
            shadow: false,
        }
    }

    fn conditions_changed(mut self) -> Self {
        self.path_only = self.methods.is_empty() && self.host.is_none() && self.headers.is_empty();
        self
    }

    /// The same rule with the subject composed of `parts`, in order (no parts: the one part
    /// given to [`Self::new`] stays).
    #[must_use]
    pub fn with_subject(mut self, parts: impl IntoIterator<Item = SubjectSource>) -> Self {
        let parts: Vec<Part> = parts.into_iter().map(part).collect();
        if !parts.is_empty() {
            self.subject = parts;
        }
        self
    }

    /// The same rule, matching only these methods (none: any method).
    #[must_use]
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self.conditions_changed()
    }

    /// The same rule, matching only requests for `host` (case-insensitive, the request's
    /// port ignored).
    #[must_use]
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into().to_ascii_lowercase());
        self.conditions_changed()
    }

    /// The same rule, matching only requests where every one of `conditions` holds.
    #[must_use]
    pub fn with_headers(mut self, conditions: impl IntoIterator<Item = HeaderCondition>) -> Self {
        self.headers = conditions
            .into_iter()
            .map(|c| match c {
                HeaderCondition::Present(n) => (header(n), None),
                HeaderCondition::Equals(n, v) => {
                    let v = HeaderValue::try_from(v).ok();
                    // An invalid value (refused by the parser) can match nothing: no request
                    // header holds a control byte.
                    (header(n), Some(v.unwrap_or(HeaderValue::from_static("\t"))))
                }
            })
            .collect();
        self.conditions_changed()
    }

    /// The same rule, charging `cost` per request.
    #[must_use]
    pub fn with_cost(mut self, cost: CostSource) -> Self {
        self.cost = match cost {
            CostSource::Fixed(c) => RuleCost::Fixed(c),
            CostSource::Header(h) => RuleCost::Header(header(h)),
        };
        self
    }

    /// The same rule in shadow mode when `shadow`: its limit is evaluated and charged as
    /// usual, reported in the headers and metrics, and never denies the request (a policy
    /// in shadow mode is in it under every rule).
    #[must_use]
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The policy this rule charges.
    pub fn policy(&self) -> &PolicyId {
        &self.policy
    }

    /// Whether this rule itself is in shadow mode ([`Self::with_shadow`]).
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// Whether `req` meets every condition of this rule.
    pub fn matches<B>(&self, req: &Request<B>) -> bool {
        if self.path_only {
            return self.matches_path(req.uri().path());
        }
        self.matches_path(req.uri().path())
            && (self.methods.is_empty() || self.methods.contains(req.method()))
            && self
                .host
                .as_ref()
                .is_none_or(|h| host_of(req).is_some_and(|r| r.eq_ignore_ascii_case(h)))
            && self.headers.iter().all(|(name, value)| {
                let got = req.headers().get(name);
                match value {
                    None => got.is_some(),
                    Some(v) => got == Some(v),
                }
            })
    }

    pub(crate) fn matches_path(&self, path: &str) -> bool {
        let p = self.path_prefix.as_str();
        p == "/"
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Whether one request can match both `self` and `other` when its method is `method`
    /// (`None`: a method neither names).
    fn compatible(&self, other: &Rule, method: Option<&Method>) -> bool {
        let allows = |r: &Rule| match method {
            Some(m) => r.methods.is_empty() || r.methods.contains(m),
            None => r.methods.is_empty(),
        };
        let paths = self.matches_path(&other.path_prefix) || other.matches_path(&self.path_prefix);
        let hosts = match (&self.host, &other.host) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let headers = self.headers.iter().all(|(n, v)| {
            other
                .headers
                .iter()
                .all(|(m, w)| n != m || v.is_none() || w.is_none() || v == w)
        });
        allows(self) && allows(other) && paths && hosts && headers
    }
}

/// The host `req` is for: the URI's authority, else the `Host` header; without the port and
/// a trailing dot.
fn host_of<B>(req: &Request<B>) -> Option<&str> {
    let raw = match req.uri().host() {
        Some(h) => h,
        None => req.headers().get(http::header::HOST)?.to_str().ok()?,
    };
    let host = match raw.rsplit_once(':') {
        // An IPv6 literal in brackets keeps its colons.
        Some((h, port)) if !port.contains(']') => h,
        _ => raw,
    };
    Some(host.trim_end_matches('.'))
}

/// The indices of the largest group of `rules` that can all match one request (by the
/// rules' conditions alone: methods, path prefixes, hosts, header conditions). Exact for
/// these conditions; the search is exponential in the worst case, fine for the tens of rules
/// a configuration holds.
pub fn most_overlapping(rules: &[Rule]) -> Vec<usize> {
    let mut methods: Vec<Option<&Method>> = vec![None];
    for m in rules.iter().flat_map(|r| &r.methods) {
        if !methods.contains(&Some(m)) {
            methods.push(Some(m));
        }
    }
    let mut best = Vec::new();
    for method in methods {
        let candidates: Vec<usize> = (0..rules.len())
            .filter(|&i| rules[i].compatible(&rules[i], method))
            .collect();
        let mut clique = Vec::new();
        grow(rules, method, &mut clique, &candidates, &mut best);
    }
    best
}

/// Extends `clique` by every candidate compatible with all of it, keeping the largest found.
fn grow(
    rules: &[Rule],
    method: Option<&Method>,
    clique: &mut Vec<usize>,
    candidates: &[usize],
    best: &mut Vec<usize>,
) {
    if clique.len() > best.len() {
        best.clone_from(clique);
    }
    if clique.len() + candidates.len() <= best.len() {
        return;
    }
    for (k, &i) in candidates.iter().enumerate() {
        let rest: Vec<usize> = candidates[k + 1..]
            .iter()
            .copied()
            .filter(|&j| rules[i].compatible(&rules[j], method))
            .collect();
        clique.push(i);
        grow(rules, method, clique, &rest, best);
        clique.pop();
        if clique.len() + candidates.len() - k <= best.len() {
            return;
        }
    }
}

/// The raw bytes of subject `part` in `req`; `ip` is the peer address as text ([`ip_text`]).
/// A part the request lacks is empty.
pub(crate) fn raw_part<'a, B>(part: &'a Part, req: &'a Request<B>, ip: &'a [u8]) -> &'a [u8] {
    match part {
        Part::Header(name) => req
            .headers()
            .get(name)
            .map_or(&[][..], HeaderValue::as_bytes),
        Part::Ip => ip,
        Part::Segment(i) => req
            .uri()
            .path()
            .split('/')
            .skip(1)
            .nth(*i)
            .map_or(&[][..], str::as_bytes),
        Part::Const(c) => c.as_bytes(),
    }
}

/// The peer address of `req` as `peer` reads it, as text written into `scratch` (empty
/// without an address).
pub(crate) fn ip_text<'a, B>(req: &Request<B>, peer: PeerIp, scratch: &'a mut IpText) -> &'a [u8] {
    match peer(req.extensions()) {
        Some(addr) => scratch.format(addr),
        None => &[][..],
    }
}

/// The text of an IP address (`Display`), on the stack.
pub(crate) struct IpText {
    buf: [u8; 64],
}

impl IpText {
    pub(crate) fn new() -> Self {
        Self { buf: [0; 64] }
    }

    fn format(&mut self, ip: IpAddr) -> &[u8] {
        let mut cursor = std::io::Cursor::new(&mut self.buf[..]);
        // 64 bytes hold every IPv4 and IPv6 text form; a failed write is impossible, and
        // would only shorten the text.
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as usize;
        &self.buf[..len]
    }
}

/// Reads the peer's IP address from a request's extensions, where the server put it.
pub type PeerIp = fn(&Extensions) -> Option<IpAddr>;

/// The [`PeerIp`] of a layer that was given none: no address, the empty subject.
pub(crate) fn no_peer(_: &Extensions) -> Option<IpAddr> {
    None
}

/// The digest of `rule`'s subject in `req`, or 400 when a header or path part is longer than
/// [`MAX_SUBJECT_BYTES`].
pub(crate) fn subject<B, R: From<String>>(
    rule: &Rule,
    req: &Request<B>,
    peer: PeerIp,
    limiter: &Limiter,
) -> Result<shared_contract::SubjectDigest, Response<R>> {
    let mut scratch = IpText::new();
    let ip: &[u8] = if rule.subject.contains(&Part::Ip) {
        ip_text(req, peer, &mut scratch)
    } else {
        &[]
    };
    // One part, the common case: read once, checked and digested as it is.
    if let [one] = rule.subject.as_slice() {
        let raw = raw_part(one, req, ip);
        return match too_long(one, raw.len()) {
            Some(refused) => Err(refused),
            None => Ok(limiter.digest(raw)),
        };
    }
    for part in &rule.subject {
        if let Some(refused) = too_long(part, raw_part(part, req, ip).len()) {
            return Err(refused);
        }
    }
    Ok(limiter.digest_composed(rule.subject.iter().map(|p| raw_part(p, req, ip))))
}

/// The 400 for a subject `part` of `len` bytes when that is more than [`MAX_SUBJECT_BYTES`].
fn too_long<R: From<String>>(part: &Part, len: usize) -> Option<Response<R>> {
    if len <= MAX_SUBJECT_BYTES {
        return None;
    }
    let what = match part {
        Part::Header(name) => format!("the subject header {name}"),
        Part::Segment(i) => format!("the subject path segment {i}"),
        Part::Ip | Part::Const(_) => "a subject part".to_owned(),
    };
    Some(problem::bad_request(
        "subject_too_long",
        &format!("{what} is {len} bytes, at most {MAX_SUBJECT_BYTES} are accepted"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> PolicyId {
        PolicyId::new(name).expect("valid id")
    }

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).expect("request")
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let r = Rule::new("/api/", id("api"), SubjectSource::Ip);
        assert!(r.matches(&get("/api")) && r.matches(&get("/api/")) && r.matches(&get("/api/x")));
        assert!(!r.matches(&get("/apix")) && !r.matches(&get("/ap")));
        assert!(Rule::new("/", id("api"), SubjectSource::Ip).matches(&get("/anything")));
    }

    #[test]
    fn every_condition_must_hold() {
        let r = Rule::new("/api", id("api"), SubjectSource::Ip)
            .with_methods([Method::POST, Method::PUT])
            .with_host("API.example.com")
            .with_headers([
                HeaderCondition::parse("x-tenant").expect("valid"),
                HeaderCondition::parse("X-Tier=gold").expect("valid"),
            ]);
        let request = |method: Method, host: &str, tier: &str| {
            Request::builder()
                .method(method)
                .uri("/api/x")
                .header("host", host)
                .header("x-tenant", "t")
                .header("x-tier", tier)
                .body(())
                .expect("request")
        };
        assert!(r.matches(&request(Method::POST, "api.example.com:8080", "gold")));
        assert!(r.matches(&request(Method::PUT, "Api.Example.Com", "gold")));
        assert!(!r.matches(&request(Method::GET, "api.example.com", "gold")));
        assert!(!r.matches(&request(Method::POST, "other.example.com", "gold")));
        assert!(!r.matches(&request(Method::POST, "api.example.com", "silver")));
        let no_tenant = Request::post("/api/x")
            .header("host", "api.example.com")
            .header("x-tier", "gold")
            .body(())
            .expect("request");
        assert!(!r.matches(&no_tenant));
    }

    #[test]
    fn header_conditions_and_costs_parse_what_they_display() {
        for text in ["x-tenant", "x-tier=gold", "x-a=b=c"] {
            let c = HeaderCondition::parse(text).expect("valid");
            assert_eq!(c.to_string(), text);
            assert_eq!(c.name(), text.split('=').next().expect("a name"));
        }
        for bad in ["", "a b", "=x", "x-a=\u{7}"] {
            assert!(HeaderCondition::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_method("get"), Ok(Method::GET));
        assert_eq!(
            parse_method("PURGE").map(|m| m.to_string()),
            Ok("PURGE".into())
        );
        assert!(parse_method("").is_err() && parse_method("GE T").is_err());
        let c = CostSource::parse_header("header:X-Cost").expect("valid");
        assert_eq!(c.to_string(), "header:x-cost");
        for bad in ["x-cost", "header:", "header:a b"] {
            assert!(CostSource::parse_header(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_largest_overlap_respects_every_condition() {
        let rule = |prefix: &str| Rule::new(prefix, id("p"), SubjectSource::Ip);
        let rules = vec![
            rule("/api"),
            rule("/api/x").with_methods([Method::GET]),
            rule("/api/x/y").with_methods([Method::GET, Method::POST]),
            rule("/api/z"),
            rule("/").with_methods([Method::POST]),
            rule("/api").with_host("a.example"),
            rule("/api").with_host("b.example"),
            rule("/api").with_headers([HeaderCondition::parse("x-t=1").expect("valid")]),
            rule("/api").with_headers([HeaderCondition::parse("x-t=2").expect("valid")]),
            rule("/api").with_headers([HeaderCondition::parse("x-t").expect("valid")]),
        ];
        let mut best = most_overlapping(&rules);
        best.sort_unstable();
        // GET /api/x/y on a.example with x-t: 1.
        assert_eq!(best, [0, 1, 2, 5, 7, 9]);
        assert!(most_overlapping(&[]).is_empty());
    }

    #[test]
    fn subject_parts_read_what_the_request_holds() {
        let mut req = Request::get("/v1/tenants/t-9/items")
            .header("x-key", "k")
            .body(())
            .expect("request");
        req.extensions_mut().insert(IpAddr::from([10, 0, 0, 1]));
        let peer: PeerIp = |e| e.get::<IpAddr>().copied();
        let mut scratch = IpText::new();
        let ip = ip_text(&req, peer, &mut scratch);
        assert_eq!(ip, b"10.0.0.1");
        let read = |p: Part| raw_part(&p, &req, ip).to_vec();
        assert_eq!(read(Part::Segment(2)), b"t-9");
        assert_eq!(read(Part::Segment(4)), b"");
        assert_eq!(read(Part::Ip), b"10.0.0.1");
        assert_eq!(read(Part::Header(HeaderName::from_static("x-key"))), b"k");
        assert_eq!(read(Part::Header(HeaderName::from_static("x-no"))), b"");
        assert_eq!(read(Part::Const("global".into())), b"global");
    }
}
