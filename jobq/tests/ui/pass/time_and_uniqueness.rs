//! Every key about time and uniqueness, and an upgrade chain.
use jobq::{Job, JobError, Missed, Unique, UniqueState};

#[derive(serde::Serialize, serde::Deserialize, Default)]
pub struct Args {
    pub customer_id: i64,
    pub kind_of_report: String,
}

#[jobq::job(kind = "nightly_report", cron = "0 3 * * *", tz = "Europe/Berlin", missed = "all(max = 3)")]
pub async fn nightly(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "quarter_hourly", every = "15m", missed = "skip")]
pub async fn quarter(_args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "seconds", cron = "*/10 * * * * *")]
pub async fn seconds(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(
    unique(by = [customer_id, kind_of_report], period = "1h", states = [pending, running]),
    max_age = "24h"
)]
pub async fn report(_args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(unique, debounce = "30s")]
pub async fn reindex(_args: Args) -> Result<(), JobError> {
    Ok(())
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct V1 {
    pub total: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct V2 {
    pub cents: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct InvoiceArgs {
    pub cents: i64,
    pub currency: String,
}

#[jobq::upgrade(from = 1)]
fn v1_to_v2(old: V1) -> V2 {
    V2 { cents: old.total * 100 }
}

#[jobq::upgrade(from = 2)]
fn v2_to_v3(old: V2) -> InvoiceArgs {
    InvoiceArgs { cents: old.cents, currency: "EUR".into() }
}

#[jobq::job(kind = "invoice", version = 3)]
pub async fn invoice(args: InvoiceArgs) -> Result<(), JobError> {
    let _ = (args.cents, args.currency);
    Ok(())
}

fn main() {
    assert!(Nightly::periodic().is_some());
    assert_eq!(Nightly::periodic().unwrap().0.expression(), "0 3 * * *");
    assert_eq!(Quarter::periodic().unwrap().0.expression(), "every 15m");
    assert!(Report::periodic().is_none());
    assert_eq!(Report::MAX_AGE, Some(std::time::Duration::from_secs(86_400)));
    assert_eq!(
        Report::UNIQUE,
        Some(
            Unique::new()
                .period(std::time::Duration::from_secs(3600))
                .states(&[UniqueState::Pending, UniqueState::Running])
        )
    );
    assert_eq!(Reindex::DEBOUNCE, Some(std::time::Duration::from_secs(30)));
    assert_eq!(Invoice::VERSION, 3);
    let old = Invoice::decode(1, r#"{"total": 2}"#).ok().unwrap();
    assert_eq!((old.cents, old.currency.as_str()), (200, "EUR"));
    assert_eq!(Invoice::decode(9, "{}").err().unwrap().code, "unknown_version");
    let _ = Missed::Once;
}
