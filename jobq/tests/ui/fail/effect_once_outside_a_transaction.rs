// The effect ledger and complete-in-transaction accept only the caller's transaction: a
// pool would autocommit the ledger row apart from the effect, so it must not compile.
async fn handler(ctx: jobq::JobContext, pool: sqlx::PgPool) -> Result<(), jobq::Error> {
    if ctx.effect_once(&pool, "invoice-42-sent").await? {
        // the effect
    }
    ctx.complete_in_tx(&pool).await?;
    Ok(())
}

fn main() {
    let _ = handler;
}
