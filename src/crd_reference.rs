//! A field reference for a CRD, generated from its OpenAPI schema: one row
//! per field with its type, bounds, default and description. `flotilla crd
//! [fleet] --reference` prints it; `make crd` writes docs/crd-*.md, and a
//! unit test fails when they drift from the types. Pure.

use serde_json::Value;

/// The commands that print each reference.
pub const MICROSERVICE: &str = "flotilla crd --reference";
pub const FLEET: &str = "flotilla crd fleet --reference";

/// The reference of `crd` (a CustomResourceDefinition as JSON), as markdown.
pub fn markdown(crd: &Value, regenerate: &str) -> String {
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or("?");
    let group = crd["spec"]["group"].as_str().unwrap_or("?");
    let version = &crd["spec"]["versions"][0];
    let short: Vec<&str> = crd["spec"]["names"]["shortNames"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = format!("# {kind} field reference\n\n");
    out += &format!(
        "`apiVersion: {group}/{}`, `kind: {kind}`, {} (short names: {}). Generated from the CRD by `{regenerate}`; `make crd` rewrites this file and a unit test fails when it is stale.\n\n",
        version["name"].as_str().unwrap_or("?"),
        crd["spec"]["scope"].as_str().unwrap_or("?").to_lowercase(),
        if short.is_empty() {
            "none".to_string()
        } else {
            short.join(", ")
        },
    );
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    for top in ["spec", "status"] {
        let Some(s) = schema.get(top) else { continue };
        out += &format!("## {top}\n\n");
        if let Some(d) = s["description"].as_str() {
            out += &format!("{}\n\n", one_line(d));
        }
        out += "| field | type | required | description |\n|---|---|---|---|\n";
        let mut rows = Vec::new();
        fields(s, top, &mut rows);
        for r in rows {
            out += &r;
        }
        out += "\n";
    }
    out
}

/// Rows for every property under `schema`, depth first, in schema order.
fn fields(schema: &Value, path: &str, rows: &mut Vec<String>) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, field) in props {
        let here = format!("{path}.{name}");
        rows.push(format!(
            "| `{here}` | {} | {} | {} |\n",
            type_of(field),
            if required.contains(&name.as_str()) {
                "yes"
            } else {
                ""
            },
            describe(field)
        ));
        match field["type"].as_str() {
            Some("array") => fields(&field["items"], &format!("{here}[]"), rows),
            Some("object") => fields(field, &here, rows),
            _ => {}
        }
    }
}

fn type_of(field: &Value) -> String {
    let t = field["type"].as_str().unwrap_or("any");
    match t {
        "array" => format!("[]{}", field["items"]["type"].as_str().unwrap_or("any")),
        "object" if field.get("additionalProperties").is_some() => format!(
            "map[string]{}",
            field["additionalProperties"]["type"]
                .as_str()
                .unwrap_or("any")
        ),
        _ => match field["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
    }
}

/// The description, then its bounds, enum and default in parentheses.
fn describe(field: &Value) -> String {
    let mut facts = Vec::new();
    for (key, label) in [
        ("minimum", "min"),
        ("maximum", "max"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("pattern", "pattern"),
    ] {
        if let Some(v) = field.get(key) {
            facts.push(format!("{label} `{}`", plain(v)));
        }
    }
    if let Some(values) = field["enum"].as_array() {
        let names: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
        facts.push(format!("one of {}", names.join(", ")));
    }
    if let Some(d) = field.get("default") {
        facts.push(format!("default `{d}`"));
    }
    let mut out = field["description"]
        .as_str()
        .map(one_line)
        .unwrap_or_default();
    if !facts.is_empty() {
        if !out.is_empty() {
            out.push(' ');
        }
        out += &format!("({})", facts.join(", "));
    }
    out.replace('|', "\\|")
}

/// A bound or enum value as written: strings bare, whole numbers without ".0".
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A description on one table line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_a_row_with_its_path_type_bounds_and_default() {
        let crd = serde_json::json!({
            "spec": {"group": "g.io", "scope": "Namespaced",
              "names": {"kind": "K", "shortNames": ["k"]},
              "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {
                "spec": {"type": "object", "required": ["port"], "properties": {
                  "port": {"type": "integer", "format": "int32", "minimum": 1.0, "maximum": 65535, "description": "The\nport | here"},
                  "waves": {"type": "array", "maxItems": 8, "items": {"type": "object", "properties": {
                    "name": {"type": "string", "pattern": "^[a-z]+$"}}}},
                  "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
                  "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                }}}}}}]}
        });
        let md = markdown(&crd, "flotilla crd k --reference");
        assert!(
            md.contains("`apiVersion: g.io/v1`, `kind: K`, namespaced (short names: k)"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `spec.port` | integer (int32) | yes | The port \\| here (min `1`, max `65535`) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| `spec.waves` | []object |  | (max items `8`) |"),
            "{md}"
        );
        assert!(
            md.contains("| `spec.waves[].name` | string |  | (pattern `^[a-z]+$`) |"),
            "{md}"
        );
        assert!(
            md.contains("| `spec.mode` | string |  | (one of `A`, `B`, default `\"A\"`) |"),
            "{md}"
        );
        assert!(
            md.contains("| `spec.labels` | map[string]string |  |  |"),
            "{md}"
        );
        assert!(!md.contains("## status"), "no status in this schema");
    }

    #[test]
    fn the_committed_references_match_the_crds() {
        let ms = serde_json::to_value(<crate::crd::Microservice as kube::CustomResourceExt>::crd())
            .unwrap();
        let fms = serde_json::to_value(crate::rollout::spec::crd()).unwrap();
        assert!(
            markdown(&ms, MICROSERVICE) == include_str!("../docs/crd-microservice.md"),
            "docs/crd-microservice.md is stale: run `make crd`"
        );
        assert!(
            markdown(&fms, FLEET) == include_str!("../docs/crd-fleetmicroservice.md"),
            "docs/crd-fleetmicroservice.md is stale: run `make crd`"
        );
    }
}
