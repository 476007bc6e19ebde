use serde::Serialize;

#[derive(Serialize, jobq::Event)]
#[event(type = "a", aggregate = order_id, colour = "red")]
struct UnknownKey {
    order_id: i64,
}

#[derive(Serialize, jobq::Event)]
#[event(type = "b", aggregate = order_id)]
struct NoVersion {
    order_id: i64,
}

#[derive(Serialize, jobq::Event)]
#[event(type = "c", aggregate = missing, version = v)]
struct NoSuchField {
    v: i64,
}

#[derive(Serialize, jobq::Event)]
struct NoAttribute {
    v: i64,
}

#[derive(Serialize, jobq::Event)]
#[event(type = "d", type = "e")]
struct Duplicate {
    v: i64,
}

fn main() {}
