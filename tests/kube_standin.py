"""A stand-in Kubernetes API server for tests (no kube-apiserver can run on these machines).

It speaks the real endpoints and their semantics, as far as nriplugin uses them:

- list and watch of pods (``/api/v1/pods``) and of the cluster-scoped custom resource
  ``nodeslos.slo.koordinator.sh`` (``/apis/slo.koordinator.sh/v1alpha1/nodeslos``), with
  ``fieldSelector``, one global ``resourceVersion`` counter, watch events (ADDED, MODIFIED,
  DELETED) from a given resourceVersion, ``timeoutSeconds``, and ``410 Gone`` (an ERROR event
  with an ``Expired`` Status, as the API server sends it) for a resourceVersion older than
  the compacted history;
- the Eviction subresource (``POST .../pods/NAME/eviction``, ``policy/v1``): 201 and graceful
  deletion, ``dryRun=All``, 404 for a missing pod, 409 for a failed UID precondition, and 429
  when a PodDisruptionBudget (``minAvailable`` over a label selector, in the pod's
  namespace) would be violated;
- core/v1 Events: POST and PATCH (merge) in a namespace;
- bearer-token authentication (401 without it);
- RBAC denials: a (verb, resource) in ``forbidden`` gets 403 with the API server's Status,
  before anything else is looked at (authorization comes before routing there too);
- a type that is not served: any other path, and nodeslos while ``nodeslos_served`` is off
  (the CRD not installed, or its version ``served: false``), get the API server's 404 Status
  for an unknown resource (``details`` without a name); a missing single object gets a 404
  naming it;
- ``unavailable``: 503 for every request, as an API server that cannot serve yet;
- ``tls``: served over TLS with that context (its verify mode says whether client certificates
  are required), else plain HTTP;
- the cluster-scoped ``nodemetrics.slo.koordinator.sh``: list and watch as nodeslos, and its
  ``status`` subresource patched (JSON patch or merge patch): the result is validated against
  the vendored CRD's openAPIV3Schema (``kind/crds/``) and refused with 422 Invalid, naming the
  fields, as the API server does; metadata and spec stay as they were; ``refuse_status`` makes
  every status patch get the answer it names.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import json
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from jsonschema import Draft4Validator

SLO_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
METRIC_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics"
NODEMETRIC_CRD = Path(__file__).resolve().parent.parent / "kind" / "crds" / "slo.koordinator.sh_nodemetrics.yaml"


@functools.cache
def nodemetric_schema() -> dict[str, Any]:
    """The vendored NodeMetric CRD's openAPIV3Schema (v1alpha1)."""
    crd = yaml.safe_load(NODEMETRIC_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return dict(version["schema"]["openAPIV3Schema"])


TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool, for ?watch=


@dataclass
class PDB:
    namespace: str
    name: str
    selector: dict[str, str]
    min_available: int

    def selects(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in self.selector.items())


@dataclass
class Change:
    rv: int
    kind: str  # "pods", "nodeslos" or "nodemetrics"
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]


@dataclass
class KubeStandIn:
    token: str = "standin-token"
    user: str = "system:serviceaccount:nriplugin-system:nriplugin"  # who the token is, in 403 messages
    nodeslos_served: bool = True  # off: the NodeSLO CRD is not installed (its objects are kept)
    forbidden: set[tuple[str, str]] = field(default_factory=set)  # (verb, "resource.group" or "resource")
    unavailable: bool = False
    grace_delay: float = 0.0  # how long a gracefully deleted pod stays (Terminating)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodeslos: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodemetrics_served: bool = True  # off: the NodeMetric CRD is not installed
    nodemetrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    refuse_status: tuple[int, str, str] | None = None  # (code, reason, message) for every status patch
    status_patches: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (monotonic, status) taken
    pdbs: list[PDB] = field(default_factory=list)
    events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path?query)
    history: list[Change] = field(default_factory=list)
    compacted: int = 0  # watches from a resourceVersion below this get 410 Gone
    rv: int = 100
    port: int = 0
    tls: ssl.SSLContext | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _runner: web.AppRunner | None = None
    _uids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _streams: set[web.StreamResponse] = field(default_factory=set)

    # the server ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen (again, on the same port after stop(): an API server that comes back)."""
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_get(SLO_PATH, self._list_nodeslos)
        app.router.add_get(SLO_PATH + "/{name}", self._get_nodeslo)
        app.router.add_get(METRIC_PATH, self._list_nodemetrics)
        app.router.add_patch(METRIC_PATH + "/{name}/status", self._patch_nodemetric_status)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._post_event)
        app.router.add_patch("/api/v1/namespaces/{ns}/events/{name}", self._patch_event)
        app.router.add_route("*", "/{tail:.*}", self._unknown)  # last: what no route above serves
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls)
        await site.start()
        if not self.port:
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Go away: open watches are cut, new connections refused."""
        for resp in list(self._streams):
            task = resp.task
            if task is not None:
                task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if self.unavailable:
            return status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        verb, group, resource = rbac_request(request.method, request.path, request.query)
        qualified = f"{resource}.{group}" if group else resource
        if (verb, qualified) in self.forbidden:
            why = (
                f'{qualified} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
                f'in API group "{group}" at the cluster scope'
            )
            return status(403, "Forbidden", why, group=group, kind=resource)
        return await handler(request)  # type: ignore[no-any-return]

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        return not_served()

    def serve_nodeslos(self, served: bool) -> None:
        """Install (True) or remove the NodeSLO type; removing it ends the open NodeSLO watches
        cleanly, as the API server does, and keeps the objects (a version switched to
        ``served: false``)."""
        self.nodeslos_served = served
        asyncio.get_running_loop().create_task(self._notify())

    # the store ------------------------------------------------------------------------------------

    def _record(self, kind: str, type_: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append(Change(self.rv, kind, type_, json.loads(json.dumps(obj))))
        asyncio.get_running_loop().create_task(self._notify())
        return obj

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def compact(self) -> None:
        """Forget the history so far (etcd compaction): older watches get 410 Gone."""
        self.compacted = self.rv + 1
        self.history.clear()

    def put_nodeslo(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        old = self.nodeslos.get(name)
        obj = {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeSLO",
            "metadata": {
                "name": name,
                "uid": old["metadata"]["uid"] if old else f"slo-{next(self._uids)}",
                "generation": (old["metadata"]["generation"] + 1) if old else 1,
            },
            "spec": spec,
        }
        self.nodeslos[name] = obj
        return self._record("nodeslos", "MODIFIED" if old else "ADDED", obj)

    def delete_nodeslo(self, name: str) -> None:
        self._record("nodeslos", "DELETED", self.nodeslos.pop(name))

    def put_nodemetric(self, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create or update a NodeMetric's spec (what koord-manager does); its status stays."""
        old = self.nodemetrics.get(name)
        obj = {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeMetric",
            "metadata": {
                "name": name,
                "uid": old["metadata"]["uid"] if old else f"metric-{next(self._uids)}",
                "generation": (old["metadata"]["generation"] + 1) if old else 1,
            },
            "spec": spec if spec is not None else {},
        }
        if old and "status" in old:
            obj["status"] = old["status"]
        self.nodemetrics[name] = obj
        return self._record("nodemetrics", "MODIFIED" if old else "ADDED", obj)

    def delete_nodemetric(self, name: str) -> None:
        self._record("nodemetrics", "DELETED", self.nodemetrics.pop(name))

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        labels: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}
        if priority is not None:
            spec["priority"] = priority
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}-{next(self._uids)}",
                "labels": dict(labels or {}),
                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            "spec": spec,
            "status": {"phase": "Running"},
        }
        self.pods[(namespace, name)] = obj
        return self._record("pods", "ADDED", obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        obj = self.pods.pop((namespace, name), None)
        if obj is not None:
            self._record("pods", "DELETED", obj)

    # list and watch -----------------------------------------------------------------------------

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "pods", "PodList", "v1", list(self.pods.values()))

    async def _list_nodeslos(self, request: web.Request) -> web.StreamResponse:
        if not self.nodeslos_served:
            return not_served()
        items = list(self.nodeslos.values())
        return await self._list_or_watch(request, "nodeslos", "NodeSLOList", "slo.koordinator.sh/v1alpha1", items)

    async def _get_nodeslo(self, request: web.Request) -> web.StreamResponse:
        if not self.nodeslos_served:
            return not_served()
        name = request.match_info["name"]
        obj = self.nodeslos.get(name)
        if obj is None:
            why = f'nodeslos.slo.koordinator.sh "{name}" not found'
            return status(404, "NotFound", why, name=name, group="slo.koordinator.sh", kind="nodeslos")
        return web.json_response(obj)

    async def _list_nodemetrics(self, request: web.Request) -> web.StreamResponse:
        if not self.nodemetrics_served:
            return not_served()
        items = list(self.nodemetrics.values())
        return await self._list_or_watch(request, "nodemetrics", "NodeMetricList", "slo.koordinator.sh/v1alpha1", items)

    async def _patch_nodemetric_status(self, request: web.Request) -> web.StreamResponse:
        if not self.nodemetrics_served:
            return not_served()
        name = request.match_info["name"]
        obj = self.nodemetrics.get(name)
        if obj is None:
            why = f'nodemetrics.slo.koordinator.sh "{name}" not found'
            return status(404, "NotFound", why, name=name, group="slo.koordinator.sh", kind="nodemetrics")
        if self.refuse_status is not None:
            code, reason, message = self.refuse_status
            return status(code, reason, message)
        body = await request.json()
        kind = request.content_type
        try:
            if kind == "application/json-patch+json":
                patched = json_patch(obj, body)
            elif kind == "application/merge-patch+json":
                patched = merge(obj, body)
            else:
                return status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {kind}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            return status(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}")
        new = {**copy.deepcopy(obj), "status": patched.get("status")}
        if new["status"] is None:
            del new["status"]
        errors = sorted(Draft4Validator(nodemetric_schema()).iter_errors(new), key=lambda e: list(map(str, e.path)))
        if errors:
            causes = [
                {"reason": "FieldValueInvalid", "message": e.message, "field": ".".join(map(str, e.path))}
                for e in errors
            ]
            why = f'NodeMetric.slo.koordinator.sh "{name}" is invalid: ' + "; ".join(
                f"{c['field']}: {c['message']}" for c in causes
            )
            return status(422, "Invalid", why, name=name, group="slo.koordinator.sh", kind="NodeMetric", causes=causes)
        self.nodemetrics[name] = new
        self.status_patches.append((time.monotonic(), copy.deepcopy(new.get("status") or {})))
        return web.json_response(self._record("nodemetrics", "MODIFIED", new))

    async def _list_or_watch(
        self, request: web.Request, kind: str, list_kind: str, api: str, items: list[dict[str, Any]]
    ) -> web.StreamResponse:
        try:
            selector = parse_selector(request.query.get("fieldSelector", ""))
        except ValueError as exc:
            return status(400, "BadRequest", str(exc))
        if request.query.get("watch") not in TRUE:
            chosen = [o for o in items if matches(o, selector)]
            meta = {"resourceVersion": str(self.rv)}
            return web.json_response({"apiVersion": api, "kind": list_kind, "metadata": meta, "items": chosen})
        return await self._watch(request, kind, selector)

    async def _watch(self, request: web.Request, kind: str, selector: list[tuple[str, str]]) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.rv)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        self._streams.add(resp)
        try:
            if since < self.compacted - 1:
                gone = status_body(410, "Expired", f"too old resource version: {since} ({self.compacted})")
                await resp.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return resp
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                if (kind == "nodeslos" and not self.nodeslos_served) or (
                    kind == "nodemetrics" and not self.nodemetrics_served
                ):
                    return resp  # the type went away: the API server ends its watches
                for change in [c for c in self.history if c.rv > since]:
                    since = change.rv
                    if change.kind == kind and matches(change.obj, selector):
                        await resp.write(json.dumps({"type": change.type, "object": change.obj}).encode() + b"\n")
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return resp
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), left)
                    except TimeoutError:
                        return resp
        finally:
            self._streams.discard(resp)

    # eviction -------------------------------------------------------------------------------------

    async def _evict(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = await request.json()
        if body.get("kind") != "Eviction" or body.get("metadata", {}).get("name") != name:
            return status(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self.pods.get((ns, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        options = body.get("deleteOptions") or {}
        uid = (options.get("preconditions") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            have = pod["metadata"]["uid"]
            why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
            return status(409, "Conflict", why)
        if "deletionTimestamp" not in pod["metadata"]:
            for pdb in self.pdbs:
                if pdb.namespace != ns or not pdb.selects(pod):
                    continue
                healthy = sum(
                    1
                    for p in self.pods.values()
                    if p["metadata"]["namespace"] == ns and "deletionTimestamp" not in p["metadata"] and pdb.selects(p)
                )
                if healthy - 1 < pdb.min_available:
                    return status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        causes=[
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb.name} needs {pdb.min_available} healthy pods "
                                f"and has {healthy} currently",
                            }
                        ],
                    )
        if request.query.get("dryRun") != "All" and "deletionTimestamp" not in pod["metadata"]:
            grace = options.get("gracePeriodSeconds", 30)
            pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
            self._record("pods", "MODIFIED", pod)
            asyncio.get_running_loop().call_later(self.grace_delay, self.delete_pod, ns, name)
        return web.json_response(status_body(201, "", "", status_="Success"), status=201)

    # events -------------------------------------------------------------------------------------

    async def _post_event(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        ev = await request.json()
        name = ev.get("metadata", {}).get("name")
        missing = [f for f in ("involvedObject", "reason", "message") if not ev.get(f)]
        if not name or missing:
            return status(422, "Invalid", f"Event is invalid: missing {missing or ['metadata.name']}")
        # The API server's rule: an Event's namespace is its object's; for a cluster-scoped
        # object (no namespace) it must be "default".
        involved_ns = ev["involvedObject"].get("namespace") or ""
        if involved_ns != ns and not (involved_ns == "" and ns == "default"):
            return status(422, "Invalid", "Event is invalid: involvedObject.namespace does not match event.namespace")
        if (ns, name) in self.events:
            return status(409, "AlreadyExists", f'events "{name}" already exists')
        ev["metadata"]["namespace"] = ns
        self.rv += 1
        ev["metadata"]["resourceVersion"] = str(self.rv)
        self.events[(ns, name)] = ev
        return web.json_response(ev, status=201)

    async def _patch_event(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.events:
            return status(404, "NotFound", f'events "{key[1]}" not found')
        self.events[key] = merge(self.events[key], await request.json())
        return web.json_response(self.events[key])


def rbac_request(method: str, path: str, query: Any) -> tuple[str, str, str]:
    """(verb, API group, resource) of a request, as the API server's authorizer sees it."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = (parts[1] if len(parts) > 1 else ""), parts[3:]
    else:
        return method.lower(), "", ""
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = (rest[0] if rest else "") + (f"/{rest[2]}" if len(rest) > 2 else "")
    if method == "GET":
        verb = "watch" if query.get("watch") in TRUE else ("get" if len(rest) > 1 else "list")
    else:
        verb = {"POST": "create", "PUT": "update"}.get(method, method.lower())
    return verb, group, resource


def not_served() -> web.Response:
    """The API server's answer for a resource type it does not serve: 404, no name in details."""
    body = status_body(404, "NotFound", "the server could not find the requested resource")
    body["details"] = {}
    return web.json_response(body, status=404)


def parse_selector(text: str) -> list[tuple[str, str]]:
    out = []
    for term in filter(None, text.split(",")):
        key, sep, value = term.partition("=")
        if not sep or "!" in key:
            raise ValueError(f"unsupported field selector {term!r}")
        out.append((key, value.lstrip("=")))
    return out


def matches(obj: dict[str, Any], selector: list[tuple[str, str]]) -> bool:
    for key, want in selector:
        node: Any = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if str(node) != want:
            return False
    return True


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """JSON patch (RFC 6902): add, replace and remove, on JSON pointers."""
    out = copy.deepcopy(doc)
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        if not keys:
            raise ValueError("the whole document cannot be patched")
        parent = out
        for k in keys[:-1]:
            parent = parent[int(k)] if isinstance(parent, list) else parent[k]
        last = keys[-1]
        if op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in parent:
                raise KeyError(f"replace operation does not apply: doc is missing key: {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[last]
        else:
            raise ValueError(f"unsupported operation {op['op']!r}")
    return out


def merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def status_body(code: int, reason: str, message: str, status_: str = "Failure", **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status_, "code": code}
    if reason:
        body["reason"] = reason
    if message:
        body["message"] = message
    if details:
        body["details"] = details
    return body


def status(code: int, reason: str, message: str, **details: Any) -> web.Response:
    return web.json_response(status_body(code, reason, message, **details), status=code)
