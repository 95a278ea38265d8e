//! Pod-level knobs shared by both CRDs: resources and placement overrides. Bounded shapes of
//! their own rather than the full k8s-openapi types, so the CRDs stay small and every string is
//! bounded; `affinity` is passed through as an opaque object.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{StringMap, raw_object_list_schema, raw_object_schema, string_map_schema};

/// Container resources (quantities as strings, e.g. `cpu: 500m`, `memory: 1Gi`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_map_schema")]
    pub requests: Option<StringMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_map_schema")]
    pub limits: Option<StringMap>,
}

/// Placement and metadata of generated pods. Labels and annotations of the custom resource are
/// never copied onto children; these are the only ones added.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Node selector of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_map_schema")]
    pub node_selector: Option<StringMap>,
    /// Tolerations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity of the pods (a `core/v1 Affinity`, passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "raw_object_schema")]
    pub affinity: Option<serde_json::Value>,
    /// Annotations added to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_map_schema")]
    pub annotations: Option<StringMap>,
    /// Priority class of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Topology spread constraints of the pods (`core/v1 TopologySpreadConstraint`s, passed
    /// through). Engines with two or more replicas and none given spread over nodes
    /// (`kubernetes.io/hostname`, `ScheduleAnyway`); `[]` turns that off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "raw_object_list_schema")]
    pub topology_spread_constraints: Option<Vec<serde_json::Value>>,
}

/// A pod toleration (the shape of `core/v1 Toleration`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 316))]
    pub key: Option<String>,
    /// `Exists` or `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub effect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}
