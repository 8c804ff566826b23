// Validate Prometheus Operator objects against the CRD OpenAPI schemas that
// @kubernetes-models/prometheus-operator ships (generated from the operator's CRDs).
// Input: a JSON array of Kubernetes objects on stdin. Output: one JSON line per object,
// {"kind", "name", "ok", "error"}; objects of other kinds are reported with "ok": null.
// Exit status: 0 when every checked object is valid, 1 otherwise, 2 on bad input.
import { readFileSync } from "node:fs";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { AlertmanagerConfig } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1/AlertmanagerConfig";

const MODELS = {
  "monitoring.coreos.com/v1": { PodMonitor, PrometheusRule, ServiceMonitor },
  "monitoring.coreos.com/v1alpha1": { AlertmanagerConfig },
};

function check(obj) {
  const name = obj?.metadata?.name ?? "";
  const kind = obj?.kind ?? "";
  const Model = MODELS[obj?.apiVersion]?.[kind];
  if (!Model) {
    return { kind, name, ok: null, error: "not a checked monitoring.coreos.com kind" };
  }
  try {
    new Model(obj).validate();
    return { kind, name, ok: true, error: "" };
  } catch (e) {
    return { kind, name, ok: false, error: String(e.message ?? e) };
  }
}

let objects;
try {
  objects = JSON.parse(readFileSync(0, "utf8"));
  if (!Array.isArray(objects)) throw new Error("expected a JSON array of objects");
} catch (e) {
  console.error(`validate-crds: bad input: ${e.message}`);
  process.exit(2);
}
let failed = 0;
for (const obj of objects) {
  const r = check(obj);
  if (r.ok === false) failed += 1;
  console.log(JSON.stringify(r));
}
process.exit(failed ? 1 : 0);
