//! `cowlink store push | pull | remote ls | remote gc` and the remote half
//! of `store checkout --remote`: the options that name a remote, and the
//! reports.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use cowlink::store::remote::{RemoteConfig, RequestCounts, RetryPolicy};
use cowlink::store::{Digest, Store};

use crate::out::errln;
use crate::{human_bytes, human_duration, Exit};

/// The options that name and reach a remote (global to `cowlink store`).
#[derive(Args, Debug, Default, Clone)]
pub struct RemoteArgs {
    /// The remote store, s3://BUCKET/PREFIX [env: COWLINK_REMOTE]
    #[arg(long, global = true, value_name = "URL")]
    pub remote: Option<String>,

    /// The S3 server's URL, for servers other than AWS (http:// is allowed
    /// for local servers) [default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL,
    /// the profile's endpoint_url, else AWS]
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint: Option<String>,

    /// The region [default: $AWS_REGION, $AWS_DEFAULT_REGION, the
    /// profile's region, else us-east-1]
    #[arg(long, global = true, value_name = "REGION")]
    pub region: Option<String>,

    /// The AWS profile to read keys from (~/.aws/credentials, ~/.aws/config);
    /// naming one ignores AWS_ACCESS_KEY_ID [default: $AWS_PROFILE, else
    /// default]
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,

    /// Requests in flight at once
    #[arg(long, global = true, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=512))]
    pub transfers: u16,

    /// Give up on a request the server keeps failing (connection refused,
    /// 5xx, 429, timeouts) after this many seconds of retries with backoff;
    /// a server's Retry-After is honoured when it fits
    #[arg(long, global = true, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=7 * 86400))]
    pub retry_timeout: u64,

    /// Fail a request when the server sends nothing for this many seconds
    /// (a transfer that keeps flowing never times out)
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub idle_timeout: u64,
}

/// `cowlink store remote …`.
#[derive(Subcommand, Debug)]
pub enum RemoteCommand {
    /// List the manifests on the remote
    #[command(after_help = "Examples:\n  cowlink store --remote s3://ci-cache/builds remote ls")]
    Ls,
    /// Remove objects on the remote that no kept manifest uses
    ///
    /// Without --keep every manifest is kept and only objects no manifest
    /// names go (left by a push that died). With --keep, the manifests not
    /// named are removed too, before their objects. Objects of pushes
    /// still running are never removed: each push marks itself on the
    /// remote first, rewrites its mark every minute, and waits while a gc
    /// runs; a push silent for longer than --grace is taken for dead.
    /// Incomplete multipart uploads older than --grace are aborted. Only
    /// keys of cowlink's exact layout are touched: anything else under
    /// the prefix is left alone and listed.
    #[command(
        after_help = "Examples:\n  cowlink store remote gc                 # objects no manifest names\n  cowlink store remote gc --keep $M       # everything but this tree"
    )]
    Gc {
        /// Keep this manifest (repeatable); the others are removed
        #[arg(long, value_name = "MANIFEST")]
        keep: Vec<String>,
        /// How long a push may go without a sign of life before its
        /// marker is removed, and an incomplete upload before it is
        /// aborted (30s, 15m, 24h, 7d; at most 3653d). Under 2m a live push
        /// may be taken for dead
        #[arg(long, value_name = "AGE", default_value = "24h", value_parser = age_arg)]
        grace: Duration,
    },
}

/// `30s`, `15m`, `24h`, `7d`, up to the library's `MAX_GRACE`; checked
/// arithmetic, so no value wraps into a short one.
fn age_arg(s: &str) -> std::result::Result<Duration, String> {
    let shown = cowlink::name::quoted(std::path::Path::new(s));
    let bad = || format!("{shown} is not an age such as 30s, 15m, 24h or 7d");
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let secs: u64 = match unit {
        "s" | "" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(bad()),
    };
    let max = cowlink::store::remote::MAX_GRACE;
    let too_long = || {
        format!(
            "{shown} is longer than the longest grace period accepted, {}d (10 years)",
            max.as_secs() / 86400
        )
    };
    if n.is_empty() {
        return Err(bad());
    }
    // All digits: a parse error is only an overflow.
    let n: u64 = n.parse().map_err(|_| too_long())?;
    let d = n
        .checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(too_long)?;
    if d > max {
        return Err(too_long());
    }
    Ok(d)
}

impl RemoteArgs {
    /// The remote named by --remote or COWLINK_REMOTE, if any.
    pub fn url(&self) -> Option<String> {
        self.remote.clone().or_else(|| {
            std::env::var("COWLINK_REMOTE")
                .ok()
                .filter(|v| !v.is_empty())
        })
    }

    /// Open the remote; an error when none is named.
    pub fn open(&self) -> Result<cowlink::store::remote::Remote> {
        let url = self.url().ok_or_else(|| {
            anyhow!("no remote given: use --remote s3://BUCKET/PREFIX or set COWLINK_REMOTE")
        })?;
        let mut c = RemoteConfig::parse(&url)?;
        c.endpoint = self.endpoint.clone();
        c.region = self.region.clone();
        c.profile = self.profile.clone();
        c.transfers = usize::from(self.transfers);
        c.retry = RetryPolicy {
            timeout: Duration::from_secs(self.retry_timeout),
            idle: Duration::from_secs(self.idle_timeout),
            ..RetryPolicy::default()
        };
        Ok(cowlink::store::remote::Remote::open(c)?)
    }
}

/// "312 requests (PUT 300, HEAD 10, LIST 1, DELETE 1)".
pub fn requests_line(r: &RequestCounts) -> String {
    let parts: Vec<String> = [
        ("GET", r.get),
        ("PUT", r.put),
        ("HEAD", r.head),
        ("LIST", r.list),
        ("DELETE", r.delete),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k} {n}"))
    .collect();
    match parts.is_empty() {
        true => "0 requests".to_string(),
        false => format!(
            "{} ({})",
            crate::out::count(r.total(), "request", "requests"),
            parts.join(", ")
        ),
    }
}

fn digests(args: &[String]) -> Result<Vec<Digest>> {
    args.iter()
        .map(|s| s.parse::<Digest>().map_err(|e| anyhow!("{e}")))
        .collect()
}

/// `cowlink store push [MANIFEST…]`.
pub fn push(
    store: &Store,
    remote_args: &RemoteArgs,
    manifests: &[String],
    json: bool,
    spin: impl FnOnce() -> crate::progress::Spinner,
) -> Result<Exit> {
    let remote = remote_args.open()?;
    let wanted = digests(manifests)?;
    let start = Instant::now();
    let bar = spin();
    let r = crate::interrupt::graceful(|| store.push(&remote, &wanted));
    bar.finish();
    if crate::interrupt::interrupted() {
        errln!(
            "cowlink: interrupted; no manifest was uploaded unless all its objects were; \
             run the push again to finish"
        );
        return Ok(Exit::Interrupted);
    }
    let r = r?;
    let mut out = crate::out::stdout();
    if json {
        crate::out::json(&mut out, &r)?;
    } else {
        writeln!(
            out,
            "pushed {} to {} ({} already there): {} of {} uploaded ({}), \
             {} already there; {} in {}",
            crate::out::count(r.manifests_uploaded, "manifest", "manifests"),
            remote.url(),
            r.manifests_present,
            r.objects_uploaded,
            crate::out::count(r.objects, "object", "objects"),
            human_bytes(r.bytes_uploaded),
            r.objects_present,
            requests_line(&r.requests),
            human_duration(start.elapsed())
        )?;
        if r.objects_reuploaded > 0 {
            errln!(
                "cowlink: {} vanished from the remote during the push (a remote gc took it \
                 for dead?) and {} uploaded again before the manifests",
                crate::out::count(r.objects_reuploaded, "object", "objects"),
                if r.objects_reuploaded == 1 {
                    "was"
                } else {
                    "were"
                }
            );
        }
        if r.waited_for_gc_ms > 0 {
            errln!(
                "cowlink: waited {} for a remote gc to finish",
                human_duration(Duration::from_millis(r.waited_for_gc_ms))
            );
        }
    }
    Ok(Exit::Ok)
}

/// `cowlink store pull MANIFEST…`; with `quiet` (a checkout's pull) only
/// a line on stderr when something was downloaded.
pub fn pull(
    store: &Store,
    remote_args: &RemoteArgs,
    manifests: &[Digest],
    json: bool,
    quiet: bool,
    spin: impl FnOnce() -> crate::progress::Spinner,
) -> Result<Exit> {
    let remote = remote_args.open()?;
    let start = Instant::now();
    let bar = spin();
    let r = crate::interrupt::graceful(|| store.pull(&remote, manifests));
    bar.finish();
    if crate::interrupt::interrupted() {
        errln!(
            "cowlink: interrupted; the objects verified so far are stored (and what arrived of \
             large ones is kept in the store's tmp/), no manifest was written; run the pull \
             again to finish"
        );
        return Ok(Exit::Interrupted);
    }
    let r = r?;
    let resumed = match r.objects_resumed {
        0 => String::new(),
        n => format!(
            ", {} resumed from an earlier pull ({} not downloaded again)",
            n,
            human_bytes(r.bytes_resumed)
        ),
    };
    let line = format!(
        "pulled {} from {} ({} already here): {} of {} downloaded ({}){resumed}, \
         {} already here; {} in {}",
        crate::out::count(r.manifests, "manifest", "manifests"),
        remote.url(),
        r.manifests_local,
        r.objects_downloaded,
        crate::out::count(r.objects, "object", "objects"),
        human_bytes(r.bytes_downloaded),
        r.objects_present,
        requests_line(&r.requests),
        human_duration(start.elapsed())
    );
    if quiet {
        if r.objects_downloaded > 0 || r.manifests_fetched > 0 {
            errln!("{line}");
        }
    } else if json {
        crate::out::json(&mut crate::out::stdout(), &r)?;
    } else {
        writeln!(crate::out::stdout(), "{line}")?;
    }
    Ok(Exit::Ok)
}

/// `cowlink store pull MANIFEST…` from the command line's strings.
pub fn pull_args(
    store: &Store,
    remote_args: &RemoteArgs,
    manifests: &[String],
    json: bool,
    spin: impl FnOnce() -> crate::progress::Spinner,
) -> Result<Exit> {
    let wanted = digests(manifests)?;
    pull(store, remote_args, &wanted, json, false, spin)
}

/// `cowlink store remote ls | gc`.
pub fn remote(remote_args: &RemoteArgs, command: RemoteCommand, json: bool) -> Result<Exit> {
    let remote = remote_args.open()?;
    let mut out = crate::out::stdout();
    match command {
        RemoteCommand::Ls => {
            let rows = remote.manifests()?;
            if json {
                crate::out::json(&mut out, &rows)?;
            } else if rows.is_empty() {
                errln!(
                    "no manifests on {} (push some with `cowlink store push`)",
                    remote.url()
                );
            } else {
                writeln!(out, "{:<64}  {:>10}  UPLOADED", "MANIFEST", "SIZE")?;
                for r in &rows {
                    writeln!(
                        out,
                        "{}  {:>10}  {}",
                        r.digest,
                        human_bytes(r.bytes),
                        r.uploaded
                    )?;
                }
            }
        }
        RemoteCommand::Gc { keep, grace } => {
            let keep = digests(&keep)?;
            let start = Instant::now();
            let r = remote.gc((!keep.is_empty()).then_some(keep.as_slice()), grace)?;
            if json {
                crate::out::json(&mut out, &r)?;
            } else {
                writeln!(
                    out,
                    "kept {} and {}; removed {}, {} ({}), \
                     {} markers of dead pushes; protected {} pushes in progress; {} in {}",
                    crate::out::count(r.manifests_kept, "manifest", "manifests"),
                    crate::out::count(r.objects_kept, "object", "objects"),
                    crate::out::count(r.manifests_removed, "manifest", "manifests"),
                    crate::out::count(r.objects_removed, "object", "objects"),
                    human_bytes(r.bytes_removed),
                    r.markers_removed,
                    r.pushes_protected,
                    requests_line(&r.requests),
                    human_duration(start.elapsed())
                )?;
                if r.uploads_aborted + r.uploads_kept > 0 {
                    writeln!(
                        out,
                        "incomplete uploads: aborted {} older than the grace period, kept {}",
                        r.uploads_aborted, r.uploads_kept
                    )?;
                }
                if r.keys_left_alone > 0 {
                    writeln!(
                        out,
                        "left alone {} that {} not cowlink's:",
                        crate::out::count(r.keys_left_alone, "key", "keys"),
                        if r.keys_left_alone == 1 { "is" } else { "are" }
                    )?;
                    for k in &r.left_alone {
                        writeln!(out, "  {}", cowlink::name::shown(std::path::Path::new(k)))?;
                    }
                    if r.keys_left_alone > r.left_alone.len() as u64 {
                        writeln!(
                            out,
                            "  … and {} more (all are in --json's count)",
                            r.keys_left_alone - r.left_alone.len() as u64
                        )?;
                    }
                }
            }
            if let Some(why) = &r.uploads_not_listed {
                errln!("cowlink: incomplete uploads were not cleaned: {why}");
            }
        }
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read() {
        assert_eq!(age_arg("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(age_arg("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(age_arg("7d").unwrap(), Duration::from_secs(7 * 86400));
        assert!(age_arg("1w").is_err() && age_arg("h").is_err());
        assert_eq!(age_arg("3653d").unwrap(), cowlink::store::remote::MAX_GRACE);
    }

    /// Issue 44, item 8: no age wraps or saturates into a short one;
    /// every value past ten years is refused, naming it.
    #[test]
    fn ages_past_ten_years_are_refused_never_wrapped() {
        let max = cowlink::store::remote::MAX_GRACE.as_secs();
        for (unit, secs) in [("s", 1u64), ("m", 60), ("h", 3600), ("d", 86400), ("", 1)] {
            let limit = max / secs;
            for n in [
                limit + 1,
                limit * 2,
                (u64::MAX / secs).saturating_add(1),
                u64::MAX,
                10_000_000_000_000_000,
            ] {
                let arg = format!("{n}{unit}");
                let e = age_arg(&arg).unwrap_err();
                assert!(e.contains(&arg) && e.contains("longest"), "{arg}: {e}");
            }
            assert!(age_arg(&format!("{limit}{unit}")).is_ok());
        }
        let e = age_arg("99999999999999999999999s").unwrap_err();
        assert!(e.contains("longest"), "{e}");
        assert!(age_arg("\x1b[2J").unwrap_err().contains("$'"));
    }
}
