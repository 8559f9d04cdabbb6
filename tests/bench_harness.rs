//! The JSONSchemaBench harness (`cargo bench --bench jsonschemabench`) on a
//! directory it can be checked against: counts, the summary's keys, compile
//! errors named by reason.

mod common;

#[path = "../benches/jsonschemabench/harness.rs"]
mod harness;

#[test]
fn the_harness_counts_what_it_ran() {
    let tmp = common::tiny::temp_dir("jsonschemabench");
    let tok = tmp.join("tokenizer.json");
    common::trained_byte_level().save(&tok, false).unwrap();
    let dir = tmp.join("schemas");
    std::fs::create_dir_all(&dir).unwrap();
    let doc = serde_json::json!({
        "schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]},
        "tests": [{"valid": true, "data": {"n": 3}}, {"valid": false, "data": {"n": -1}}, {"valid": false, "data": {}}]
    });
    std::fs::write(dir.join("a.json"), doc.to_string()).unwrap();
    std::fs::write(dir.join("b.json"), serde_json::json!({"schema": {"not": {"required": ["a", "b"]}}, "tests": []}).to_string()).unwrap();
    let (v, text) = harness::bench(&dir, &tok).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "schemas", "compiled", "compile_errors", "compile_ms_p50", "compile_ms_p99", "mask_count", "mask_us_p50",
            "mask_us_p90", "mask_us_p99", "mask_us_max", "valid_accepted", "valid_total", "invalid_rejected", "invalid_total"
        ]
    );
    assert_eq!((v["schemas"].as_u64(), v["compiled"].as_u64(), v["compile_errors"].as_u64()), (Some(2), Some(1), Some(1)));
    assert_eq!((v["valid_accepted"].as_u64(), v["valid_total"].as_u64()), (Some(1), Some(1)));
    assert_eq!((v["invalid_rejected"].as_u64(), v["invalid_total"].as_u64()), (Some(2), Some(2)));
    assert!(v["mask_count"].as_u64().unwrap() > 0);
    assert!(text.contains("JSON Schema keyword `not`"), "compile errors are named: {text}");
    assert!(harness::bench(&tmp.join("nowhere"), &tok).unwrap_err().contains("cannot read"));
}
