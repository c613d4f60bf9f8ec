//! Where the remote is and how to sign for it: the one place that reads
//! `s3://BUCKET/PREFIX`, the endpoint, the region, the credentials and the
//! retry policy, from explicit values first, then the environment, then
//! the AWS profile files, as the AWS CLI does.
//!
//! | setting | explicit | environment | profile files |
//! |---|---|---|---|
//! | endpoint | `endpoint` | `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL` | `endpoint_url` (config) |
//! | region | `region` | `AWS_REGION`, `AWS_DEFAULT_REGION` | `region` (config) |
//! | keys | `keys` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | `aws_access_key_id`, … (credentials, then config) |
//! | profile | `profile` (then the environment's keys are ignored) | `AWS_PROFILE` | `default` |
//!
//! The files are `AWS_SHARED_CREDENTIALS_FILE` (default
//! `~/.aws/credentials`, sections `[NAME]`) and `AWS_CONFIG_FILE` (default
//! `~/.aws/config`, sections `[profile NAME]`, or `[default]`). An
//! `http://` endpoint is allowed (a local server); path-style requests are
//! used whenever an endpoint is given, as MinIO, Garage and versitygw want.

use std::path::PathBuf;
use std::time::Duration;

use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// How transient failures (connection refused or reset, timeouts, 5xx
/// answers, 429) are retried: exponential backoff from 100 ms doubling up
/// to `max_backoff` (or the server's `Retry-After`), until `timeout` has
/// passed since the first try. Permanent answers (403, 404, a missing
/// bucket) are never retried. A transfer fails when the server sends
/// nothing for `idle`, however long it has been flowing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries per request after the first try, at most (the default is
    /// unbounded: `timeout` ends the retries).
    pub max_retries: usize,
    /// Longest wait between two tries.
    pub max_backoff: Duration,
    /// Give up on a request after this long, retries included.
    pub timeout: Duration,
    /// Fail a request when the server sends nothing for this long (no
    /// answer, or no byte of a body); a transfer that keeps flowing never
    /// times out.
    pub idle: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: usize::MAX,
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(60),
            idle: Duration::from_secs(30),
        }
    }
}

/// An access key and its secret (shown without the secret by `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    /// The access key ID.
    pub access_key: String,
    /// The secret access key.
    pub secret_key: String,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// A remote store as the user named it, before the environment is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// The bucket.
    pub bucket: String,
    /// The key prefix inside the bucket (no leading or trailing `/`; empty
    /// for the bucket's root).
    pub prefix: String,
    /// The server's URL (`http://127.0.0.1:9000`); `None`: the
    /// environment, the profile, else AWS itself.
    pub endpoint: Option<String>,
    /// The region; `None`: the environment, the profile, else `us-east-1`.
    pub region: Option<String>,
    /// The profile of the AWS files to read; `None`: `AWS_PROFILE`, else
    /// `default`. Naming one ignores the environment's keys (as `aws
    /// --profile` does).
    pub profile: Option<String>,
    /// Keys given directly (access key, secret key): they win over the
    /// environment and the profile files.
    pub keys: Option<Keys>,
    /// Requests in flight at once.
    pub transfers: usize,
    /// How failures are retried.
    pub retry: RetryPolicy,
}

impl RemoteConfig {
    /// Read `s3://BUCKET[/PREFIX]`.
    ///
    /// # Errors
    /// `InvalidInput` naming the URL when it is not of that form.
    pub fn parse(url: &str) -> Result<RemoteConfig> {
        let bad = |why: &str| {
            Error::new(Operation::Remote, ErrorKind::InvalidInput)
                .with_src(url)
                .with_reason(format!("{why}; a remote is written s3://BUCKET/PREFIX"))
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("only s3:// remotes are supported"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(bad(&format!(
                "'{bucket}' is not a bucket name (3 to 63 lower-case letters, digits, '-' or '.')"
            )));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix
            .split('/')
            .any(|p| p == "." || p == ".." || (p.is_empty() && !prefix.is_empty()))
        {
            return Err(bad("the prefix has an empty, '.' or '..' part"));
        }
        Ok(RemoteConfig {
            bucket: bucket.to_string(),
            prefix,
            endpoint: None,
            region: None,
            profile: None,
            keys: None,
            transfers: 16,
            retry: RetryPolicy::default(),
        })
    }

    /// `s3://BUCKET/PREFIX` again.
    pub fn url(&self) -> String {
        match self.prefix.as_str() {
            "" => format!("s3://{}", self.bucket),
            p => format!("s3://{}/{p}", self.bucket),
        }
    }
}

/// Everything needed to sign requests, resolved.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Resolved {
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    pub token: Option<String>,
    /// Where the keys came from, for messages ("AWS_ACCESS_KEY_ID",
    /// "profile 'ci' in ~/.aws/credentials").
    pub keys_from: String,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("keys_from", &self.keys_from)
            .finish_non_exhaustive()
    }
}

/// One profile's keys from one file.
#[derive(Debug, Default)]
struct ProfileValues {
    access_key: Option<String>,
    secret_key: Option<String>,
    token: Option<String>,
    region: Option<String>,
    endpoint: Option<String>,
    /// The first setting cowlink does not act on (`credential_process`…).
    unsupported: Option<&'static str>,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(rel)))
}

/// A section's keys, each with its value's lines.
type Keyed = Vec<(String, Vec<String>)>;

/// An AWS profile file read as botocore reads it: Python's
/// `configparser.RawConfigParser` with its defaults, which the AWS CLI
/// uses. The rules, each a line of the table in the tests:
///
/// - A line whose first non-blank character is `#` or `;` is a comment.
///   There are no inline comments: `key = a # b` is `a # b`.
/// - `[NAME]` (after trimming the line) opens a section; NAME is every
///   character up to the last `]`, kept as it is (case, inner blanks).
///   `[DEFAULT]` is special: its keys apply to every section.
/// - `key = value` or `key: value`, split at the first `=` or `:`; the key
///   is trimmed and lower-cased, the value trimmed and otherwise taken
///   as it is: no quotes removed, no backslash escapes, no `%`
///   interpolation (`a\b"c=d` is exactly that).
/// - A line indented deeper than its key's line continues the value
///   (joined with a newline, trailing blank lines dropped); so does a
///   blank line followed by one.
/// - A key before any section, a line that is neither, an empty key, a
///   section or a key given twice: the file is refused, as the AWS CLI
///   refuses it.
#[derive(Debug, Default)]
pub(super) struct Ini {
    /// Sections in file order (not `DEFAULT`), each with its keys.
    sections: Vec<(String, Keyed)>,
    defaults: Keyed,
}

impl Ini {
    /// Parse `text`; the error names the line.
    pub(super) fn parse(text: &str) -> std::result::Result<Ini, String> {
        let mut ini = Ini::default();
        // The current section (None: DEFAULT) and key, once there is one.
        let mut cur: Option<Option<usize>> = None;
        let mut key: Option<usize> = None;
        let mut indent_level = usize::MAX;
        let mut added: std::collections::HashSet<(Option<usize>, String)> = Default::default();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let stripped = line.trim();
            let comment = stripped.starts_with('#') || stripped.starts_with(';');
            if stripped.is_empty() || comment {
                if !comment {
                    if let (Some(s), Some(k)) = (cur, key) {
                        ini.keys_mut(s)[k].1.push(String::new());
                    }
                }
                continue;
            }
            let indent = line.chars().take_while(|c| c.is_whitespace()).count();
            if let (Some(s), Some(k)) = (cur, key) {
                if indent > indent_level {
                    ini.keys_mut(s)[k].1.push(stripped.to_string());
                    continue;
                }
            }
            indent_level = indent;
            let header = stripped
                .strip_prefix('[')
                .and_then(|r| r.rfind(']').filter(|&e| e > 0).map(|e| &r[..e]));
            if let Some(name) = header {
                key = None;
                if name == "DEFAULT" {
                    cur = Some(None);
                } else if let Some(at) = ini.sections.iter().position(|(s, _)| s == name) {
                    return Err(format!(
                        "line {n}: section [{name}] again (first at index {at})"
                    ));
                } else {
                    ini.sections.push((name.to_string(), Vec::new()));
                    cur = Some(Some(ini.sections.len() - 1));
                }
                continue;
            }
            let Some(s) = cur else {
                return Err(format!("line {n}: a key before any [section]"));
            };
            let Some(p) = stripped.find(['=', ':']) else {
                return Err(format!("line {n} is neither a [section] nor key = value"));
            };
            let name = stripped[..p].trim_end().to_lowercase();
            if name.is_empty() {
                return Err(format!(
                    "line {n} has no key before its '{}'",
                    &stripped[p..=p]
                ));
            }
            if !added.insert((s, name.clone())) {
                return Err(format!("line {n}: the key {name} again in its section"));
            }
            let keys = ini.keys_mut(s);
            keys.push((name, vec![stripped[p + 1..].trim().to_string()]));
            key = Some(keys.len() - 1);
        }
        Ok(ini)
    }

    fn keys_mut(&mut self, s: Option<usize>) -> &mut Keyed {
        match s {
            Some(i) => &mut self.sections[i].1,
            None => &mut self.defaults,
        }
    }

    /// The value of `key` in the section at `i` (or DEFAULT's), as
    /// configparser joins it.
    fn value(&self, i: usize, key: &str) -> Option<String> {
        let find = |keys: &Keyed| {
            keys.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.join("\n").trim_end().to_string())
        };
        find(&self.sections[i].1).or_else(|| find(&self.defaults))
    }

    /// The section a profile reads from: in the credentials file `[NAME]`;
    /// in the config file `[profile NAME]` (the header split as a shell
    /// would, as botocore does) or `[default]`; the last one in the file
    /// wins.
    fn profile(&self, profile: &str, config_file: bool) -> Option<usize> {
        let mut found = None;
        for (i, (name, _)) in self.sections.iter().enumerate() {
            let hit = if !config_file {
                name == profile
            } else if name.starts_with("profile") {
                shell_words(name).is_some_and(|w| w.len() == 2 && w[1] == profile)
            } else {
                name == "default" && profile == "default"
            };
            if hit {
                found = Some(i);
            }
        }
        found
    }
}

/// `s` split into words as Python's `shlex.split` does (POSIX: blanks
/// separate, `'…'` literal, `"…"` with `\"` and `\\`, `\x` is `x`);
/// `None` for an unclosed quote.
fn shell_words(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut w: Option<String> = None;
    let mut c = s.chars();
    while let Some(ch) = c.next() {
        match ch {
            ' ' | '\t' | '\n' | '\r' => {
                if let Some(x) = w.take() {
                    words.push(x);
                }
            }
            '\'' => {
                let cur = w.get_or_insert_with(String::new);
                loop {
                    match c.next()? {
                        '\'' => break,
                        x => cur.push(x),
                    }
                }
            }
            '"' => {
                let cur = w.get_or_insert_with(String::new);
                loop {
                    match c.next()? {
                        '"' => break,
                        '\\' => match c.next()? {
                            x @ ('"' | '\\' | '$' | '`') => cur.push(x),
                            x => {
                                cur.push('\\');
                                cur.push(x);
                            }
                        },
                        x => cur.push(x),
                    }
                }
            }
            '\\' => w.get_or_insert_with(String::new).push(c.next()?),
            x => w.get_or_insert_with(String::new).push(x),
        }
    }
    words.extend(w);
    Some(words)
}

/// Settings of a profile that need a process, a browser or a second
/// request to yield keys: out of scope (the error says what to do).
const UNSUPPORTED: [&str; 6] = [
    "credential_process",
    "sso_session",
    "sso_start_url",
    "role_arn",
    "web_identity_token_file",
    "sso_account_id",
];

/// The profile `profile` of the file `path` (`config_file`: the config
/// file's `[profile NAME]` sections), if both exist.
fn read_profile(path: &PathBuf, profile: &str, config_file: bool) -> Result<ProfileValues> {
    let bad = |why: String| {
        Error::new(Operation::Remote, ErrorKind::InvalidInput)
            .with_src(path)
            .with_reason(format!("cannot read the AWS profile file: {why}"))
    };
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ProfileValues::default()),
        Err(e) => return Err(bad(e.to_string())),
    };
    if text.len() > 16 << 20 {
        return Err(bad("larger than 16 MiB".to_string()));
    }
    let text = String::from_utf8(text).map_err(|_| bad("not UTF-8".to_string()))?;
    let ini = Ini::parse(&text).map_err(bad)?;
    let Some(i) = ini.profile(profile, config_file) else {
        return Ok(ProfileValues::default());
    };
    let get = |k: &str| ini.value(i, k).filter(|v| !v.is_empty());
    Ok(ProfileValues {
        access_key: get("aws_access_key_id"),
        secret_key: get("aws_secret_access_key"),
        token: get("aws_session_token"),
        region: get("region"),
        endpoint: get("endpoint_url"),
        unsupported: UNSUPPORTED.iter().find(|k| get(k).is_some()).copied(),
    })
}

impl RemoteConfig {
    /// Resolve the endpoint, region and keys (see the module's table).
    pub(super) fn resolve(&self) -> Result<Resolved> {
        let profile = self
            .profile
            .clone()
            .or_else(|| env("AWS_PROFILE"))
            .unwrap_or_else(|| "default".to_string());
        let creds_path = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
        let config_path = home_file("AWS_CONFIG_FILE", ".aws/config");
        let from_creds = match &creds_path {
            Some(p) => read_profile(p, &profile, false)?,
            None => ProfileValues::default(),
        };
        let from_config = match &config_path {
            Some(p) => read_profile(p, &profile, true)?,
            None => ProfileValues::default(),
        };
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| from_config.endpoint.clone());
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(Error::new(Operation::Remote, ErrorKind::InvalidInput)
                    .with_src(e)
                    .with_reason("an endpoint is a URL: http://HOST:PORT or https://HOST"));
            }
        }
        let region = self
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| from_config.region.clone())
            .unwrap_or_else(|| "us-east-1".to_string());
        // An explicit profile wins over the environment's keys, as with
        // `aws --profile`; otherwise the environment wins.
        let env_keys = match (
            &self.profile,
            env("AWS_ACCESS_KEY_ID"),
            env("AWS_SECRET_ACCESS_KEY"),
        ) {
            (None, Some(a), Some(s)) => Some((a, s, env("AWS_SESSION_TOKEN"))),
            _ => None,
        };
        let shown = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or_else(String::new, |p| p.display().to_string())
        };
        // A profile that gets its keys from a process, SSO or a role
        // (which the AWS CLI would use before any key in the files) is
        // out of scope: say so rather than sign with other keys.
        let has_keys = from_creds.access_key.is_some() || from_config.access_key.is_some();
        let unsupported = [(&from_config, &config_path), (&from_creds, &creds_path)]
            .into_iter()
            .find_map(|(v, p)| {
                v.unsupported
                    .filter(|k| *k != "credential_process" || !has_keys)
                    .map(|k| (k, p))
            });
        let (access_key, secret_key, token, keys_from) = if let Some(k) = &self.keys {
            let given = "the keys given".to_string();
            (k.access_key.clone(), k.secret_key.clone(), None, given)
        } else if let Some((a, s, t)) = env_keys {
            (
                a,
                s,
                t,
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".to_string(),
            )
        } else if let Some((setting, path)) = unsupported {
            return Err(Error::new(Operation::Remote, ErrorKind::NotSupported)
                .with_src(self.url())
                .with_reason(format!(
                    "profile '{profile}' in {} gets its keys through {setting}, which cowlink \
                     does not use (credential_process, SSO and roles are out of scope): export \
                     keys first, e.g. eval \"$(aws configure export-credentials --profile \
                     {profile} --format env)\"",
                    shown(path)
                )));
        } else if let (Some(a), Some(s)) = (&from_creds.access_key, &from_creds.secret_key) {
            let from = format!("profile '{profile}' in {}", shown(&creds_path));
            (a.clone(), s.clone(), from_creds.token.clone(), from)
        } else if let (Some(a), Some(s)) = (&from_config.access_key, &from_config.secret_key) {
            let from = format!("profile '{profile}' in {}", shown(&config_path));
            (a.clone(), s.clone(), from_config.token.clone(), from)
        } else {
            return Err(Error::new(Operation::Remote, ErrorKind::PermissionDenied)
                .with_src(self.url())
                .with_reason(format!(
                    "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give \
                     profile '{profile}' keys in {} (instance roles are not used)",
                    shown(&creds_path)
                )));
        };
        Ok(Resolved {
            endpoint,
            region,
            access_key,
            secret_key,
            token,
            keys_from,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let c = RemoteConfig::parse("s3://my-bucket/ci/cache/").unwrap();
        assert_eq!(
            (c.bucket.as_str(), c.prefix.as_str()),
            ("my-bucket", "ci/cache")
        );
        assert_eq!(c.url(), "s3://my-bucket/ci/cache");
        let c = RemoteConfig::parse("s3://my-bucket").unwrap();
        assert_eq!(c.prefix, "");
        for bad in [
            "gs://b/p",
            "s3://",
            "s3://B/p",
            "s3://ab",
            "s3://b-b/a//b",
            "s3://bbb/../x",
        ] {
            let e = RemoteConfig::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}");
            assert!(e.to_string().contains("s3://BUCKET/PREFIX"), "{e}");
        }
    }

    #[test]
    fn profile_sections_are_read_from_both_files() {
        let dir = std::env::temp_dir().join(format!("cowlink-aws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let creds = dir.join("credentials");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n[ci]\naws_access_key_id=CI\n",
        )
        .unwrap();
        let config = dir.join("config");
        std::fs::write(
            &config,
            "[profile ci]\nregion = eu-west-3\nendpoint_url = http://h:1\n",
        )
        .unwrap();
        let d = read_profile(&creds, "default", false).unwrap();
        assert_eq!(
            (d.access_key.as_deref(), d.secret_key.as_deref()),
            (Some("AK"), Some("SK"))
        );
        let ci = read_profile(&config, "ci", true).unwrap();
        assert_eq!(ci.region.as_deref(), Some("eu-west-3"));
        assert_eq!(ci.endpoint.as_deref(), Some("http://h:1"));
        assert!(read_profile(&dir.join("none"), "x", false)
            .unwrap()
            .access_key
            .is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// botocore's reading of profile files (Python's RawConfigParser), case
    /// by case: (file text, section, key, the value the AWS CLI reads, or
    /// None). Each row is a rule of [`Ini`].
    #[test]
    fn profile_files_read_as_the_aws_cli_reads_them() {
        let table: &[(&str, &str, &str, Option<&str>)] = &[
            (
                "[default]\naws_secret_access_key = a\\b\"c\n",
                "default",
                "aws_secret_access_key",
                Some("a\\b\"c"),
            ),
            (
                "[default]\nk = \"quoted\"\n",
                "default",
                "k",
                Some("\"quoted\""),
            ),
            (
                "[default]\nk = 'single'\n",
                "default",
                "k",
                Some("'single'"),
            ),
            ("[default]\nk = a=b==\n", "default", "k", Some("a=b==")),
            ("[default]\nk: a=b\n", "default", "k", Some("a=b")),
            ("[default]\nk = a: b\n", "default", "k", Some("a: b")),
            (
                "[default]\nk = abc # not a comment\n",
                "default",
                "k",
                Some("abc # not a comment"),
            ),
            (
                "[default]\nk = abc ; nor this\n",
                "default",
                "k",
                Some("abc ; nor this"),
            ),
            ("[default]\n# k = commented\n", "default", "k", None),
            ("[default]\n  ; k = commented\n", "default", "k", None),
            ("[default]\nk = 100%\n", "default", "k", Some("100%")),
            ("[default]\nk = %(x)s\n", "default", "k", Some("%(x)s")),
            (
                "[default]\n   k   =   spaced   \n",
                "default",
                "k",
                Some("spaced"),
            ),
            ("[default]\r\nk = crlf\r\n", "default", "k", Some("crlf")),
            (
                "[default]\nK = upper key\n",
                "default",
                "k",
                Some("upper key"),
            ),
            (
                "[default]\nAWS_ACCESS_KEY_ID = X\n",
                "default",
                "aws_access_key_id",
                Some("X"),
            ),
            ("[Default]\nk = v\n", "default", "k", None),
            ("[ default ]\nk = v\n", "default", "k", None),
            (
                "[default]\nk = first\n  second\n",
                "default",
                "k",
                Some("first\nsecond"),
            ),
            (
                "[default]\nk = first\n\n  third\n",
                "default",
                "k",
                Some("first\n\nthird"),
            ),
            ("[default]\nk = v\n\n\n", "default", "k", Some("v")),
            (
                "[default]\nk = a\n  # not a line\n  b\n",
                "default",
                "k",
                Some("a\nb"),
            ),
            (
                "[default]\nk = a\n  j = b\n",
                "default",
                "k",
                Some("a\nj = b"),
            ),
            ("[default]\nk = a\n  j = b\n", "default", "j", None),
            ("  [default]\n  k = v\n", "default", "k", Some("v")),
            ("[default] trailing\nk = v\n", "default", "k", Some("v")),
            ("[a]b]\nk = v\n", "a]b", "k", Some("v")),
            (
                "[DEFAULT]\nk = inherited\n[ci]\nj = 1\n",
                "ci",
                "k",
                Some("inherited"),
            ),
            ("[DEFAULT]\nk = d\n[ci]\nk = own\n", "ci", "k", Some("own")),
            ("[ci]\nk =\n", "ci", "k", None),
            ("[ci]\nk = é✓\n", "ci", "k", Some("é✓")),
        ];
        for (i, (text, section, key, want)) in table.iter().enumerate() {
            let ini = Ini::parse(text).unwrap_or_else(|e| panic!("row {i} {text:?}: {e}"));
            let got = ini
                .sections
                .iter()
                .position(|(s, _)| s == section)
                .and_then(|s| ini.value(s, key))
                .filter(|v| !v.is_empty());
            assert_eq!(got.as_deref(), *want, "row {i}: {text:?}");
        }
        // What the AWS CLI refuses (the whole file).
        for bad in [
            "k = before any section\n",
            "[a]\nno delimiter\n",
            "[a]\n= no key\n",
            "[a]\nk = 1\nk = 2\n",
            "[a]\nk = 1\nK = 2\n",
            "[a]\n[a]\n",
            "[]\n",
        ] {
            assert!(Ini::parse(bad).is_err(), "{bad:?}");
        }
        // Config file sections: `[profile NAME]` split as a shell would.
        let cfg = Ini::parse(
            "[profile ci]\nr = 1\n[profile  \"two words\"]\nr = 2\n[default]\nr = 3\n\
             [profile 'q]\nr = 4\n[ci]\nr = 5\n[profile a b]\nr = 6\n",
        )
        .unwrap();
        let r = |p: &str, config: bool| cfg.profile(p, config).and_then(|i| cfg.value(i, "r"));
        assert_eq!(r("ci", true).as_deref(), Some("1"));
        assert_eq!(r("ci", false).as_deref(), Some("5"));
        assert_eq!(r("two words", true).as_deref(), Some("2"));
        assert_eq!(r("default", true).as_deref(), Some("3"));
        assert_eq!(r("'q", true), None);
        assert_eq!(r("a", true), None);
    }

    #[test]
    fn credential_process_and_sso_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("cowlink-aws-cp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config");
        std::fs::write(&config, "[profile p]\ncredential_process = /bin/keys\n").unwrap();
        let v = read_profile(&config, "p", true).unwrap();
        assert_eq!(v.unsupported, Some("credential_process"));
        std::fs::write(&config, "[profile p]\nsso_session = corp\nregion = x\n").unwrap();
        assert_eq!(
            read_profile(&config, "p", true).unwrap().unsupported,
            Some("sso_session")
        );
        std::fs::write(&config, "[profile p]\nk = 1\nk = 2\n").unwrap();
        let e = read_profile(&config, "p", true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("line 3"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Random profile files, read by this reader and by Python's own
    /// `configparser.RawConfigParser` (what botocore uses): the same
    /// sections, keys and values, or both refuse the file.
    #[test]
    fn random_profile_files_read_as_python_configparser_reads_them() {
        use std::collections::BTreeMap;
        use std::io::Write;
        let python = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import configparser,json,sys\n\
                 out=[]\n\
                 for t in json.load(sys.stdin):\n\
                 \x20 cp=configparser.RawConfigParser()\n\
                 \x20 try:\n\
                 \x20   cp.read_string(t)\n\
                 \x20   out.append({s:{o:cp.get(s,o) for o in cp.options(s)} for s in cp.sections()})\n\
                 \x20 except configparser.Error:\n\
                 \x20   out.append(None)\n\
                 json.dump(out,sys.stdout)\n",
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        // No skip: without python3 the comparison cannot run, and a test
        // that did not run must not pass.
        let mut python = python.unwrap_or_else(|e| {
            panic!("python3 is needed to compare with configparser (cannot run it: {e})")
        });
        // A small xorshift generator: the same files every run.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let sections = [
            "[default]",
            "[ci]",
            "[DEFAULT]",
            "[ a b ]",
            "[profile x]",
            "[x]]",
            "[]",
            "[y",
        ];
        let keys = ["k", "K", "aws_secret_access_key", "j", "", " k2"];
        let delims = ["=", ":", " = ", " : ", "\t=\t", "="];
        let pieces = [
            "a", "\\", "\"", "'", "#", " # ", ";", " ; ", "=", ":", "%", "%(k)s", " ", "\t", "[s]",
            "é",
        ];
        let mut texts = Vec::new();
        for _ in 0..400 {
            let mut t = String::new();
            for _ in 0..next(10) + 1 {
                let indent = ["", "", "", " ", "  ", "\t"][next(6)];
                let line = match next(10) {
                    0 | 1 => sections[next(sections.len())].to_string(),
                    2 => ["# c", "; c", "  # c = 1", ""][next(4)].to_string(),
                    3 => (0..next(4)).map(|_| pieces[next(pieces.len())]).collect(),
                    _ => {
                        let value: String =
                            (0..next(6)).map(|_| pieces[next(pieces.len())]).collect();
                        format!(
                            "{}{}{value}",
                            keys[next(keys.len())],
                            delims[next(delims.len())]
                        )
                    }
                };
                t += indent;
                t += &line;
                t += ["\n", "\n", "\r\n"][next(3)];
            }
            texts.push(t);
        }
        let input = serde_json::to_vec(&texts).unwrap();
        python.stdin.take().unwrap().write_all(&input).unwrap();
        let out = python.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: Vec<Option<BTreeMap<String, BTreeMap<String, String>>>> =
            serde_json::from_slice(&out.stdout).unwrap();
        let mut refused = 0;
        for (t, want) in texts.iter().zip(theirs) {
            let ours = Ini::parse(t).ok().map(|ini| {
                ini.sections
                    .iter()
                    .enumerate()
                    .map(|(i, (name, keys))| {
                        let all = keys.iter().chain(ini.defaults.iter());
                        let values = all
                            .map(|(k, _)| (k.clone(), ini.value(i, k).unwrap_or_default()))
                            .collect();
                        (name.clone(), values)
                    })
                    .collect::<BTreeMap<String, BTreeMap<String, String>>>()
            });
            refused += usize::from(ours.is_none());
            assert_eq!(ours, want, "{t:?}");
        }
        // Both outcomes were exercised.
        assert!(refused > 20 && refused < 380, "{refused} of 400 refused");
    }
}
