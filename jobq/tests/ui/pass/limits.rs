use jobq::{Job, JobError, KindLimits, Rate};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Delivery {
    pub destination: String,
    pub attempt: u32,
}

#[jobq::job(kind = "capped", concurrency = 5)]
pub async fn capped(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "deliver", concurrency_key = destination, concurrency = 2,
            rate = "10/min", rate_key = destination, burst = 3)]
pub async fn deliver(_args: Delivery) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "metered", rate = "100/s")]
pub async fn metered(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    assert_eq!(Capped::LIMITS, KindLimits::NONE.concurrency(5));
    assert_eq!(
        Deliver::LIMITS,
        KindLimits::NONE
            .concurrency(2)
            .per_key()
            .rate(Rate::per_minute(10))
            .burst(3)
            .rate_per_key()
    );
    assert_eq!(Metered::LIMITS, KindLimits::NONE.rate(Rate::per_second(100)));
    let args = Delivery {
        destination: "api.example.com".into(),
        attempt: 1,
    };
    assert_eq!(Deliver::concurrency_key(&args).as_deref(), Some("api.example.com"));
    assert_eq!(Deliver::rate_key(&args).as_deref(), Some("api.example.com"));
    assert_eq!(Capped::concurrency_key(&()), None);
    let _ = Deliver::with(args).concurrency_key("k").rate_key("r");
}
