//! The reservation routes against the real app: every answer has a documented status and a
//! body that validates against the documented schema.

use serde_json::Value;

use super::{Kind, case, run, serve};

const RESERVATIONS: &str = "/v1/reservations";
const SETTLE: &str = "/v1/reservations/{reservation_id}/settle";
const RESERVATION: &str = "/v1/reservations/{reservation_id}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_answers_are_documented() {
    let app = serve(Kind::Local).await;
    let reserve = |body: &str, expect| case("post", RESERVATIONS, RESERVATIONS, expect).body(body);
    let one =
        |cost: u64| format!(r#"{{"requests":[{{"policy":"api","subject":"r-1","cost":{cost}}}]}}"#);
    let bodies = run(
        &app,
        vec![
            reserve(&one(2), 201),
            reserve(&one(1), 201),
            reserve(&one(1), 429),
            reserve(r#"{"requests":[]}"#, 400),
            reserve(r#"{"ttl_ms":1000}"#, 400),
            reserve(
                r#"{"requests":[{"policy":"api","subject":"r-2"}],"ttl_ms":0}"#,
                400,
            ),
            reserve(r#"{"requests":[{"policy":"trial","subject":"r-2"}]}"#, 400),
            reserve(r#"{"requests":[{"policy":"jobs","subject":"r-2"}]}"#, 400),
            reserve(
                r#"{"requests":[{"policy":"api","subject":"r-2","cost":4}]}"#,
                400,
            ),
            reserve(r#"{"requests":"#, 400),
        ],
    )
    .await;
    let id = |body: &str| {
        let v: Value = serde_json::from_str(body).expect("JSON");
        v["reservation_id"]
            .as_str()
            .expect("a reservation id")
            .to_owned()
    };
    let (first, second) = (id(&bodies[0]), id(&bodies[1]));
    let settle = |id: &str, body: &str, expect| {
        let path = format!("/v1/reservations/{id}/settle");
        case("post", &path, SETTLE, expect).body(body)
    };
    let cancel = |id: &str, expect| {
        case(
            "delete",
            &format!("/v1/reservations/{id}"),
            RESERVATION,
            expect,
        )
    };
    let unknown = format!("r1.{}.{}", "ab".repeat(32), "0".repeat(32));
    run(
        &app,
        vec![
            settle(&first, r#"{"actual":[4]}"#, 400),
            settle(&first, r#"{"actual":[1,1]}"#, 400),
            settle(&first, r#"{"actual":[-1]}"#, 400),
            settle(&first, r#"{"actual":"many"}"#, 400),
            settle(&first, r#"{"actual":[1]}"#, 200),
            settle(&first, r#"{"actual":[1]}"#, 200),
            cancel(&first, 409),
            cancel(&second, 200),
            cancel(&second, 200),
            settle(&second, r#"{"actual":[1]}"#, 409),
            settle(&unknown, r#"{"actual":[1]}"#, 404),
            cancel(&unknown, 404),
            settle("r2.x.y", r#"{"actual":[1]}"#, 400),
            cancel("r1.x", 400),
        ],
    )
    .await;
}
