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
/// to `max_backoff`, at most `max_retries` times and never longer than
/// `timeout` in all for one request. Permanent answers (403, 404, a
/// missing bucket) are never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries per request after the first try.
    pub max_retries: usize,
    /// Longest wait between two tries.
    pub max_backoff: Duration,
    /// Give up on a request after this long, retries included.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 10,
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(60),
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
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(rel)))
}

/// The section `section` of the INI file `path`, if both exist.
fn read_profile(path: &PathBuf, section: &str) -> Result<ProfileValues> {
    if !path.exists() {
        return Ok(ProfileValues::default());
    }
    let ini = ini::Ini::load_from_file(path).map_err(|e| {
        Error::new(Operation::Remote, ErrorKind::InvalidInput)
            .with_src(path)
            .with_reason(format!("cannot read the AWS profile file: {e}"))
    })?;
    let Some(s) = ini.section(Some(section)) else {
        return Ok(ProfileValues::default());
    };
    let get = |k: &str| {
        s.get(k)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    Ok(ProfileValues {
        access_key: get("aws_access_key_id"),
        secret_key: get("aws_secret_access_key"),
        token: get("aws_session_token"),
        region: get("region"),
        endpoint: get("endpoint_url"),
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
            Some(p) => read_profile(p, &profile)?,
            None => ProfileValues::default(),
        };
        let config_section = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let from_config = match &config_path {
            Some(p) => read_profile(p, &config_section)?,
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
        let d = read_profile(&creds, "default").unwrap();
        assert_eq!(
            (d.access_key.as_deref(), d.secret_key.as_deref()),
            (Some("AK"), Some("SK"))
        );
        let ci = read_profile(&config, "profile ci").unwrap();
        assert_eq!(ci.region.as_deref(), Some("eu-west-3"));
        assert_eq!(ci.endpoint.as_deref(), Some("http://h:1"));
        assert!(read_profile(&dir.join("none"), "x")
            .unwrap()
            .access_key
            .is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
