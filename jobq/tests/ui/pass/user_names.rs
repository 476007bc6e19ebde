//! Generated code names nothing a user might: args types called `A`, `I`, `Conn`,
//! `Result`, `Job` and `Error` (each shadowing what a careless expansion would use)
//! compile, and their jobs enqueue.
use jobq::{JobContext, JobError};

macro_rules! args_named {
    ($module:ident, $name:ident, $handler:ident) => {
        pub mod $module {
            #[derive(serde::Serialize, serde::Deserialize)]
            pub struct $name {
                pub n: i64,
            }

            #[jobq::job]
            pub async fn $handler(
                _ctx: super::JobContext,
                args: $name,
            ) -> ::core::result::Result<(), super::JobError> {
                let _ = args.n;
                ::core::result::Result::Ok(())
            }
        }
    };
}

args_named!(a, A, with_a);
args_named!(i, I, with_i);
args_named!(conn, Conn, with_conn);
args_named!(result, Result, with_result);
args_named!(job, Job, with_job);
args_named!(error, Error, with_error);

#[allow(dead_code)]
async fn enqueue_each(pool: sqlx::PgPool, mut tx: sqlx::Transaction<'_, sqlx::Postgres>) {
    let _ = a::WithA::enqueue(&pool, a::A { n: 1 }).await;
    let _ = i::WithI::enqueue_many(&mut tx, [i::I { n: 1 }, i::I { n: 2 }]).await;
    let _ = conn::WithConn::enqueue(&mut tx, conn::Conn { n: 1 }).await;
    let _ = result::WithResult::enqueue(&pool, result::Result { n: 1 }).await;
    let _ = job::WithJob::with(job::Job { n: 1 }).enqueue(&pool).await;
    let _ = error::WithError::enqueue_many(&pool, vec![error::Error { n: 1 }]).await;
}

fn main() {}
