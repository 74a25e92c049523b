//! The hot path's two reads of a call, by `jsonscan` (the broker's) and by serde_json's
//! borrowed deserialisation (`&RawValue` members): the call's members and its params' on the
//! way in, the answer's members on the way back. Run under callgrind, each mode alone, to
//! count instructions per call (benches/README.md, "jsonscan or serde"):
//!
//!   valgrind --tool=callgrind target/release/deps/parse-* jsonscan 100000
//!   valgrind --tool=callgrind target/release/deps/parse-* serde 100000
//!   valgrind --tool=callgrind target/release/deps/parse-* none 100000    (the loop alone)

use serde::Deserialize;
use serde_json::value::RawValue;
use std::hint::black_box;

const CALL: &str = r#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"getDiagnostics","arguments":{"uri":"file:///home/user/project/src/main.rs"}}}"#;
const ANSWER: &str = r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":"{\"file:///home/user/project/src/main.rs\":[{\"severity\":\"Error\",\"message\":\"mismatched types\",\"range\":{\"start\":{\"line\":3,\"character\":4},\"end\":{\"line\":3,\"character\":9}}}]}"}]}}"#;

#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow)]
    jsonrpc: &'a RawValue,
    #[serde(borrow)]
    method: &'a RawValue,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    params: Params<'a>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    name: &'a RawValue,
    #[serde(borrow)]
    arguments: &'a RawValue,
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

fn by_jsonscan(call: &str, answer: &str) -> usize {
    use pi_ide_broker::wire::jsonscan::{members, members_in, plain_u64};
    let Some(([Some(j), Some(m), Some(id), Some(_)], Some([Some(n), Some(a), meta]))) = members_in(
        call,
        ["jsonrpc", "method", "id", "params"],
        3,
        ["name", "arguments", "_meta"],
    ) else {
        return 0;
    };
    let Some([Some(rid), None, Some(r), None]) =
        members(answer, ["id", "method", "result", "error"])
    else {
        return 0;
    };
    j.len()
        + m.len()
        + id.len()
        + n.len()
        + a.len()
        + meta.map_or(0, str::len)
        + r.len()
        + plain_u64(rid).unwrap_or(0) as usize
}

fn by_serde(call: &str, answer: &str) -> usize {
    let (Ok(c), Ok(ans)) = (
        serde_json::from_str::<Call>(call),
        serde_json::from_str::<Answer>(answer),
    ) else {
        return 0;
    };
    let (Some(rid), None, Some(r), None) = (ans.id, ans.method, ans.result, ans.error) else {
        return 0;
    };
    let p = &c.params;
    c.jsonrpc.get().len()
        + c.method.get().len()
        + c.id.get().len()
        + p.name.get().len()
        + p.arguments.get().len()
        + p.meta.map_or(0, |m| m.get().len())
        + r.get().len()
        + rid.get().parse::<usize>().unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("both", String::as_str);
    let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    assert_eq!(
        by_jsonscan(CALL, ANSWER),
        by_serde(CALL, ANSWER),
        "both read the same"
    );
    let mut sum = 0;
    for _ in 0..n {
        let (call, answer) = (black_box(CALL), black_box(ANSWER));
        sum += match mode {
            "jsonscan" => by_jsonscan(call, answer),
            "serde" => by_serde(call, answer),
            _ => call.len(),
        };
    }
    println!("{mode}: {n} calls, checksum {sum}");
}
