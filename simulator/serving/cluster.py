"""Deployments past one node: the cluster preset, the layout rules across nodes, the PD KV transfer
over RDMA, and ``deployment_for_nodes`` (a deployment of N nodes, for ``--nodes`` and the planner's
configuration search).

A cluster preset (``simulator/presets/clusters/*.toml``) gives the nodes, the GPUs per node and the
inter-node NIC of each GPU (one NIC per GPU, as on DGX/HGX H200: eight ConnectX-7 ports for eight
GPUs), its bandwidth and latency with their sources. A deployment names it (``cluster = "..."``).

Across nodes:

- **Tensor parallelism stays inside a node** (an NVLink domain): an instance whose attention-TP or
  MoE-TP group spans nodes is refused, unless the cluster preset sets ``cross_node_tp = true`` (then
  its all-reduces are priced over the NIC as a ring across nodes, ``collectives.nic_ring_time_s``).
- **Wide EP with DP attention** (``attention = "dp"``, ``moe = "ep"``, ``tp = dp`` = GPUs of the
  instance) may span nodes: each layer's dispatch and combine are DeepEP's internode kernels, priced
  from the DeepEP README's measured bandwidths (``collectives.deepep_time_s``): low-latency kernels for
  decode passes (SGLang ``--deepep-mode auto``), normal kernels for prefill passes.
- **PD KV transfer** (``kv_transfer``): a request's KV (MLA rows and indexer keys of every layer) goes
  from the prefill GPU to the decode host over that GPU's NIC, as Mooncake's Transfer Engine and NIXL
  move it (one-sided RDMA writes / reads). ``whole-request``: after the last layer, fully exposed
  (NIXL in vLLM reads the finished request's blocks; SGLang sends a chunk's KV after the chunk).
  ``layer-wise``: layer l's KV is sent once layer l is prefilled, so the transfer overlaps the remaining
  layers (Mooncake's layer-wise prefill streaming): with X the whole transfer and P the prefill,
  L layers, the exposed time after the prefill ends is max(X / L, X - P (L - 1) / L).
  Under HiSparse the decode side writes the KV straight to pinned host memory, so the transfer runs at
  min(NIC, the decode GPU's host link) (the NIC's DMA crosses the same PCIe switch; a derivation).
  NIC contention between requests of one prefill rank is not modelled: one 32K-token GLM-5.1
  request's 3.3 GB take 65 ms at 50 GB/s against seconds of prefill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import HisparseError
from .specs import Attention, DeploymentSpec, GpuSpec, KvTransfer, ModelSpec, MoeLayout, Spec, num


@dataclass(frozen=True)
class ClusterSpec(Spec):
    """Nodes of GPUs joined by one RDMA NIC per GPU (InfiniBand or RoCE), with sources."""

    kind: ClassVar[str] = "cluster"
    name: str
    gpu: str  # the GPU preset of every node
    nodes: int = num(ge=1, help="nodes in the cluster")
    gpus_per_node: int = num(ge=1, help="GPUs per node (one NVLink domain)")
    nic: str  # the NIC's name, e.g. "ConnectX-7 InfiniBand NDR 400 Gb/s"
    nic_bw: float = num(gt=0, help="one NIC's bandwidth per direction, bytes/s (one NIC per GPU)")
    nic_latency_us: float = num(ge=0, help="one-way RDMA latency between two nodes' GPUs")
    cross_node_tp: bool = False  # allow a tensor-parallel group across nodes (priced over the NIC)
    host_bytes: float = num(ge=0, default=0.0, help="host memory per node; 0: the deployment's host_bytes")
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # per-key source notes
    where: str = field(default="<cluster>", compare=False)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nic_rtt_s(self) -> float:
        """A round trip between two nodes: the floor of a DeepEP kernel (send, then the completion flag)."""
        return 2 * self.nic_latency_us * 1e-6


def tp_span(d: DeploymentSpec) -> int:
    """GPUs one tensor-parallel group spans: the attention-TP group, and under a TP MoE the instance
    (its MoE all-reduce or gather); under wide EP with DP attention only the attention-TP group."""
    if d.moe == MoeLayout.EP and d.attention == Attention.DP:
        return d.attn_tp
    return d.tp


def nodes_spanned(d: DeploymentSpec, gpus_per_node: int) -> int:
    """Nodes one instance spans."""
    return max(1, -(-d.tp // gpus_per_node))


def check_layout(d: DeploymentSpec, gpu: GpuSpec, cluster: ClusterSpec | None, where: str) -> None:
    """TP inside one NVLink domain unless the cluster allows it; an instance larger than a node needs
    a cluster; the deployment fits the cluster. Errors name the files and keys."""
    span = tp_span(d)
    domain = gpu.scale_up_gpus if cluster is None else min(gpu.scale_up_gpus, cluster.gpus_per_node)
    if span > domain and not (cluster is not None and cluster.cross_node_tp):
        raise HisparseError(
            f"{where}: tp = {d.tp} ({d.attention.value} attention, moe {d.moe.value}) puts a tensor-parallel group of "
            f"{span} GPUs across nodes, more than one NVLink domain of {gpu.name} ({domain} GPUs); tensor "
            "parallelism stays inside a node (use attention = \"dp\" with moe = \"ep\" for an instance across nodes, "
            "or a cluster preset with cross_node_tp = true; nvlink_domain_gpus in the GPU file for a larger domain)")
    if cluster is None:
        if d.tp > gpu.scale_up_gpus:
            raise HisparseError(
                f"{where}: an instance of tp = {d.tp} GPUs spans {nodes_spanned(d, gpu.gpus_per_node)} nodes of "
                f"{gpu.gpus_per_node} {gpu.name}: give the deployment a cluster preset (key cluster, e.g. "
                "\"16x8xh200-ib-ndr\") for the NIC between them")
        return
    if not _same_preset("gpus", cluster.gpu, d.gpu):
        raise HisparseError(f"{cluster.where}: gpu = {cluster.gpu!r} but the deployment's gpu is {d.gpu!r} ({d.where})")
    need = d.gpus + (d.prefill_gpus if d.mode.value == "pd-decode" else 0)
    if need > cluster.gpus:
        raise HisparseError(f"{d.where}: gpus = {d.gpus}" + (f" + prefill_gpus {d.prefill_gpus}" if d.prefill_gpus else "")
                            + f" need {need} GPUs, more than cluster {cluster.name}'s {cluster.nodes} nodes x "
                            f"{cluster.gpus_per_node} ({cluster.where})")


def _same_preset(kind: str, a: str, b: str) -> bool:
    """Whether two values name one preset: the same text, or the same file however spelled
    (``x.toml`` and ``./sub/../x.toml``, a preset name and its packaged file's path)."""
    if a == b:
        return True
    from .presets import resolve_or_none

    fa, fb = resolve_or_none(kind, a), resolve_or_none(kind, b)
    return fa is not None and fb is not None and fa.resolve() == fb.resolve()


# -- PD: the KV transfer -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Transfer:
    """One request's prefill-to-decode KV transfer: its length alone and what is left after the prefill."""

    total_s: float
    exposed_s: float


def kv_transfer(model: ModelSpec, tokens: int, prefill_s: float, mode: KvTransfer, cluster: ClusterSpec,
                host_link_bw: float | None = None) -> Transfer:
    """The transfer of ``tokens`` tokens' KV (MLA rows and indexer keys of every layer) over one NIC
    (``host_link_bw``: the decode side writes to pinned host memory, HiSparse), overlapped with the
    request's ``prefill_s`` as ``mode`` says (module docstring)."""
    if mode == KvTransfer.NONE or tokens <= 0:
        return Transfer(0.0, 0.0)
    bw = cluster.nic_bw if host_link_bw is None else min(cluster.nic_bw, host_link_bw)
    nbytes = tokens * (model.kv_bytes_per_token() + model.indexer_bytes_per_token())
    total = cluster.nic_latency_us * 1e-6 + nbytes / bw
    if mode == KvTransfer.WHOLE_REQUEST:
        return Transfer(total, total)
    layers = model.layers
    exposed = max(total / layers, total - prefill_s * (layers - 1) / layers)
    return Transfer(total, exposed)


# -- a deployment of N nodes -------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeLayout:
    """"A deployment with N nodes", the unit a configuration search varies: ``nodes`` decode-side nodes
    laid out as ``layout`` (``deployment_for_nodes``), and under pd-decode ``prefill_nodes`` prefill
    nodes (None: the deployment's prefill-to-decode ratio, or as many as the decode side)."""

    nodes: int
    layout: str = "auto"  # "auto" | "replicas" | "wide"
    prefill_nodes: int | None = None

    def deployment(self, d: DeploymentSpec, cluster: ClusterSpec) -> DeploymentSpec:
        return deployment_for_nodes(d, cluster, self.nodes, layout=self.layout, prefill_nodes=self.prefill_nodes)

    def overrides(self, d: DeploymentSpec, cluster: ClusterSpec) -> tuple[str, ...]:
        """As ``--set deployment.KEY=VALUE`` options (``PlanInputs.overrides``)."""
        return node_overrides(d, cluster, self.nodes, layout=self.layout, prefill_nodes=self.prefill_nodes)


def deployment_for_nodes(d: DeploymentSpec, cluster: ClusterSpec, nodes: int, *, layout: str = "auto",
                         prefill_nodes: int | None = None) -> DeploymentSpec:
    """The deployment ``d`` on ``nodes`` nodes of ``cluster`` (a decode side of ``nodes`` nodes and a
    prefill side of ``prefill_nodes`` under pd-decode). ``layout``: ``replicas`` keeps the instance and
    runs ``nodes x gpus_per_node / tp`` of it; ``wide`` makes one DP-attention wide-EP instance of
    every GPU (``tp = dp = gpus``, ``moe = "ep"``; attention-TP 1); ``auto``: ``wide`` when ``d`` is
    already a wide-EP instance of all its GPUs, else ``replicas``. The result is checked as a preset's
    values are (``check_layout`` included)."""
    if nodes < 1:
        raise HisparseError(f"--nodes {nodes}: must be >= 1")
    gpn = cluster.gpus_per_node
    gpus = nodes * gpn
    wide_now = d.attention == Attention.DP and d.moe == MoeLayout.EP and d.tp == d.dp == d.gpus
    if layout == "auto":
        layout = "wide" if wide_now and d.gpus > 1 else "replicas"
    if layout == "wide":
        changes = {"gpus": gpus, "tp": gpus, "dp": gpus, "attention": Attention.DP, "moe": MoeLayout.EP}
        if d.max_running_requests:  # the per-rank cap SGLang divides it by dp for
            changes["max_running_requests"] = d.max_running_requests // d.dp * gpus
    elif layout == "replicas":
        if gpus % d.tp:
            raise HisparseError(f"--nodes {nodes}: {gpus} GPUs are not a whole number of instances of tp {d.tp} ({d.where})")
        # each replica is the same server with its own --max-running-requests (SGLang reads it per server, and
        # plan_memory divides it by the instance's ranks): the value stays (it was scaled by the replicas, so each
        # of 2 replicas launched with 960 and ran 120 per scheduler where one ran 60)
        changes = {"gpus": gpus}
    else:
        raise HisparseError(f"layout {layout!r}: one of auto, replicas, wide")
    if d.mode.value == "pd-decode":
        pn = nodes if prefill_nodes is None else prefill_nodes
        if d.prefill_gpus and prefill_nodes is None:  # keep the prefill-to-decode ratio
            pn = max(1, round(d.prefill_gpus / d.gpus * nodes))
        changes["prefill_gpus"] = pn * gpn
    where = f"{d.where} on {nodes} node(s) of {cluster.name} ({layout})"
    out = dataclasses.replace(d, **changes, cluster=cluster.name if not d.cluster else d.cluster, where=where)
    return out


def node_overrides(d: DeploymentSpec, cluster: ClusterSpec, nodes: int, *, layout: str = "auto",
                   prefill_nodes: int | None = None) -> tuple[str, ...]:
    """``deployment_for_nodes`` as ``--set deployment.KEY=VALUE`` options (what ``hisparse plan`` and a
    plan sweep take), only the keys that change."""
    new = deployment_for_nodes(d, cluster, nodes, layout=layout, prefill_nodes=prefill_nodes)
    out = []
    for f in dataclasses.fields(DeploymentSpec):
        if f.name == "where":
            continue
        a, b = getattr(d, f.name), getattr(new, f.name)
        if a != b:
            value = b.value if hasattr(b, "value") else b
            out.append(f"deployment.{f.name}={value}")
    return tuple(out)
