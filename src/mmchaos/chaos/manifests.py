"""An experiment's faults as Chaos Mesh manifests, for a deployment that runs on Kubernetes.

mmchaos puts its faults in through its own proxy (toxiproxy's toxics); on a cluster the same faults
belong to Chaos Mesh, which injects them into the pods (tc/netem for the network, a sidecar-free
HTTP proxy for HTTPChaos, the kubelet for PodChaos). Each toxic maps onto the closest Chaos Mesh
object, and a mapping that changes what the fault does says so in the manifest's
``mmchaos.io/approximation`` annotation; a toxic without a counterpart is listed as skipped with
the reason, never silently dropped:

============== ======================================= ============================================
toxic          Chaos Mesh                              differs
============== ======================================= ============================================
latency        NetworkChaos ``delay``                  netem delays every packet of the pod, not a
                                                       share of connections (``toxicity``)
bandwidth      NetworkChaos ``bandwidth`` (KB/s: tc's  shapes the pods' egress; an ``upstream``
               ``kbps``)                               toxic slowed the client's upload
timeout        NetworkChaos ``loss``                   packets dropped (100 % at toxicity 1: the
                                                       connection hangs, as the toxic's)
reset_peer     HTTPChaos ``abort`` on requests         every request while it runs, not a share
down           PodChaos ``pod-failure``                a share of pods, not of connections
http_status    HTTPChaos ``replace.code`` (+ headers)  every response while it runs
============== ======================================= ============================================

``slicer``, ``slow_close``, ``limit_data``, ``http_corrupt``, ``http_truncate`` and
``http_drop_header`` have no Chaos Mesh counterpart. The fields written are the documented ones of
Chaos Mesh 2.x (``chaos-mesh.org/v1alpha1``); :data:`DOCUMENTED_FIELDS` holds them and
:func:`undocumented_fields` checks a manifest against them (there is no cluster to ask).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DOCUMENTED_FIELDS",
    "ChaosMeshTarget",
    "ExportedFault",
    "chaos_mesh_manifests",
    "toxic_to_chaos_mesh",
    "undocumented_fields",
]

API_VERSION = "chaos-mesh.org/v1alpha1"

_COMMON = {"selector", "mode", "value", "duration"}
DOCUMENTED_FIELDS: dict[str, set[str]] = {
    "NetworkChaos": _COMMON
    | {"action", "direction", "target", "externalTargets", "delay", "loss", "duplicate", "corrupt", "bandwidth"},
    "HTTPChaos": _COMMON | {"target", "port", "path", "method", "code", "abort", "delay", "replace", "patch"},
    "PodChaos": _COMMON | {"action", "containerNames", "gracePeriod"},
    "Workflow": {"entry", "templates"},
}
"""The ``spec`` keys Chaos Mesh 2.x documents for each kind this module writes."""
_SUB_FIELDS: dict[tuple[str, str], set[str]] = {
    ("NetworkChaos", "delay"): {"latency", "jitter", "correlation", "reorder"},
    ("NetworkChaos", "loss"): {"loss", "correlation"},
    ("NetworkChaos", "bandwidth"): {"rate", "limit", "buffer", "peakrate", "minburst"},
    ("HTTPChaos", "replace"): {"code", "body", "path", "method", "headers", "queries"},
    ("HTTPChaos", "patch"): {"body", "headers", "queries"},
    ("_", "selector"): {"namespaces", "labelSelectors", "fieldSelectors", "pods", "annotationSelectors"},
}
_ENUMS: dict[tuple[str, str], set[str]] = {
    ("_", "mode"): {"one", "all", "fixed", "fixed-percent", "random-max-percent"},
    ("NetworkChaos", "action"): {"netem", "delay", "loss", "duplicate", "corrupt", "partition", "bandwidth"},
    ("NetworkChaos", "direction"): {"to", "from", "both"},
    ("HTTPChaos", "target"): {"Request", "Response"},
    ("PodChaos", "action"): {"pod-failure", "pod-kill", "container-kill"},
}
_TEMPLATE_FIELD = {"NetworkChaos": "networkChaos", "HTTPChaos": "httpChaos", "PodChaos": "podChaos"}
_DURATION = re.compile(r"^\d+(ms|s|m|h)$")
_NO_COUNTERPART = {
    "slicer": "Chaos Mesh cannot split a stream into small delayed writes",
    "slow_close": "Chaos Mesh cannot delay a socket's close",
    "limit_data": "Chaos Mesh cannot cut a connection after N bytes",
    "http_corrupt": "HTTPChaos replaces or patches bodies but does not flip bits in them",
    "http_truncate": "HTTPChaos cannot cut a response body short",
    "http_drop_header": "HTTPChaos can replace or add headers, not remove them",
}


@dataclass(frozen=True)
class ChaosMeshTarget:
    """Which pods the faults go into, and the service's HTTP port (for HTTPChaos)."""

    namespace: str
    labels: Mapping[str, str]
    port: int = 8000
    duration: str = "60s"
    pause: str = "60s"


@dataclass(frozen=True)
class ExportedFault:
    name: str
    manifest: dict[str, Any] | None
    skipped: str = ""


def _k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:63].rstrip("-") or "fault"


def _percent(toxicity: float) -> str:
    return str(max(1, min(100, round(toxicity * 100))))


def toxic_to_chaos_mesh(name: str, toxic: Mapping[str, Any], target: ChaosMeshTarget) -> ExportedFault:
    """One toxic (toxiproxy JSON, as the fault catalogue holds them) as a Chaos Mesh object."""
    kind_of = str(toxic.get("type", ""))
    attrs: Mapping[str, Any] = toxic.get("attributes") or {}
    toxicity = float(toxic.get("toxicity", 1.0))
    stream = str(toxic.get("stream", "downstream"))
    if kind_of in _NO_COUNTERPART:
        return ExportedFault(name, None, _NO_COUNTERPART[kind_of])
    notes: list[str] = []
    partial = toxicity < 1.0
    spec: dict[str, Any] = {
        "selector": {"namespaces": [target.namespace], "labelSelectors": dict(target.labels)},
        "mode": "all",
    }
    if kind_of == "latency":
        kind = "NetworkChaos"
        spec |= {
            "action": "delay",
            "direction": "to",
            "delay": {
                "latency": f"{int(attrs.get('latency', 0))}ms",
                "jitter": f"{int(attrs.get('jitter', 0))}ms",
                "correlation": "0",
            },
        }
        if partial:
            notes.append(f"netem delays every packet, not {toxicity:.0%} of connections")
    elif kind_of == "bandwidth":
        kind = "NetworkChaos"
        rate = int(attrs.get("rate", 0))
        spec |= {
            "action": "bandwidth",
            "direction": "to",
            "bandwidth": {"rate": f"{max(1, rate)}kbps", "limit": 20971520, "buffer": 10000},
        }
        if stream == "upstream":
            notes.append("shapes the pods' egress (responses); the toxic slowed the client's upload")
    elif kind_of == "timeout":
        kind = "NetworkChaos"
        spec |= {"action": "loss", "direction": "to", "loss": {"loss": _percent(toxicity), "correlation": "0"}}
        if partial:
            notes.append(f"{toxicity:.0%} of packets dropped, not {toxicity:.0%} of connections held open")
    elif kind_of == "reset_peer":
        kind = "HTTPChaos"
        spec |= {"target": "Request", "port": target.port, "path": "*", "abort": True}
        if partial:
            notes.append(f"every request is aborted while it runs, not {toxicity:.0%}")
    elif kind_of == "down":
        kind = "PodChaos"
        spec |= {"action": "pod-failure"}
        if partial:
            spec |= {"mode": "fixed-percent", "value": _percent(toxicity)}
            notes.append(f"{_percent(toxicity)} % of the pods fail, not {toxicity:.0%} of connections")
    elif kind_of == "http_status":
        kind = "HTTPChaos"
        spec |= {"target": "Response", "port": target.port, "path": "*", "replace": {"code": int(attrs["status"])}}
        if "retry_after" in attrs:
            spec["patch"] = {"headers": [["Retry-After", str(attrs["retry_after"])]]}
        if partial:
            notes.append(f"every response is replaced while it runs, not {toxicity:.0%}")
    else:
        return ExportedFault(name, None, f"toxic type {kind_of!r} has no Chaos Mesh mapping")
    metadata: dict[str, Any] = {
        "name": _k8s_name(f"mmchaos-{name}"),
        "namespace": target.namespace,
        "labels": {"app.kubernetes.io/managed-by": "mmchaos"},
        "annotations": {"mmchaos.io/fault": name, "mmchaos.io/toxic": _toxic_line(toxic)},
    }
    if notes:
        metadata["annotations"]["mmchaos.io/approximation"] = "; ".join(notes)
    spec["duration"] = target.duration
    return ExportedFault(name, {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec})


def _toxic_line(toxic: Mapping[str, Any]) -> str:
    attrs = ", ".join(f"{k}={v}" for k, v in sorted((toxic.get("attributes") or {}).items()))
    return f"{toxic.get('type')} ({toxic.get('stream', 'downstream')}, toxicity {toxic.get('toxicity', 1.0)}) {attrs}"


def chaos_mesh_manifests(
    faults: Sequence[tuple[str, Mapping[str, Any]]], target: ChaosMeshTarget, *, workflow: bool = True
) -> tuple[list[dict[str, Any]], list[ExportedFault]]:
    """The manifests for ``faults`` ((name, toxic) pairs) and the faults skipped.

    ``workflow``: one Chaos Mesh Workflow running the faults in order, each for ``target.duration``
    with ``target.pause`` between them (the experiment's method); else one object per fault.
    """
    exported = [toxic_to_chaos_mesh(name, toxic, target) for name, toxic in faults]
    made = [e for e in exported if e.manifest is not None]
    skipped = [e for e in exported if e.manifest is None]
    if not workflow:
        return [e.manifest for e in made if e.manifest is not None], skipped
    templates: list[dict[str, Any]] = []
    children: list[str] = []
    for i, e in enumerate(made):
        assert e.manifest is not None
        spec = {k: v for k, v in e.manifest["spec"].items() if k != "duration"}
        tname = e.manifest["metadata"]["name"]
        templates.append(
            {
                "name": tname,
                "templateType": e.manifest["kind"],
                "deadline": target.duration,
                _TEMPLATE_FIELD[e.manifest["kind"]]: spec,
            }
        )
        children.append(tname)
        if i < len(made) - 1:
            templates.append({"name": f"pause-{i + 1}", "templateType": "Suspend", "deadline": target.pause})
            children.append(f"pause-{i + 1}")
    wf: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": "mmchaos-serving-faults",
            "namespace": target.namespace,
            "labels": {"app.kubernetes.io/managed-by": "mmchaos"},
        },
        "spec": {"entry": "method", "templates": [{"name": "method", "templateType": "Serial", "children": children}]},
    }
    wf["spec"]["templates"] += templates
    return [wf], skipped


def undocumented_fields(manifest: Mapping[str, Any]) -> list[str]:
    """Every field of ``manifest`` that Chaos Mesh does not document for its kind, and every bad
    enum value or duration (empty: the manifest uses documented fields only)."""
    kind = str(manifest.get("kind", ""))
    problems: list[str] = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion {manifest.get('apiVersion')!r}")
    if kind == "Workflow":
        for t in manifest.get("spec", {}).get("templates", []):
            ttype = t.get("templateType")
            if ttype in _TEMPLATE_FIELD:
                inner = {"apiVersion": API_VERSION, "kind": ttype, "spec": t[_TEMPLATE_FIELD[ttype]]}
                problems += [f"{t['name']}: {p}" for p in undocumented_fields(inner)]
            elif ttype not in ("Serial", "Suspend", "Parallel"):
                problems.append(f"templateType {ttype!r}")
            if "deadline" in t and not _DURATION.match(str(t["deadline"])):
                problems.append(f"{t['name']}.deadline {t['deadline']!r}")
        return problems
    allowed = DOCUMENTED_FIELDS.get(kind)
    if allowed is None:
        return [*problems, f"kind {kind!r}"]
    spec: Mapping[str, Any] = manifest.get("spec", {})
    for key, value in spec.items():
        if key not in allowed:
            problems.append(f"spec.{key}")
            continue
        sub = _SUB_FIELDS.get((kind, key)) or _SUB_FIELDS.get(("_", key))
        if sub is not None and isinstance(value, Mapping):
            problems += [f"spec.{key}.{k}" for k in value if k not in sub]
        enum = _ENUMS.get((kind, key)) or _ENUMS.get(("_", key))
        if enum is not None and value not in enum:
            problems.append(f"spec.{key}={value!r}")
    if "duration" in spec and not _DURATION.match(str(spec["duration"])):
        problems.append(f"spec.duration {spec['duration']!r}")
    if spec.get("mode") in ("fixed", "fixed-percent", "random-max-percent") and "value" not in spec:
        problems.append("spec.value (needed by its mode)")
    return problems
