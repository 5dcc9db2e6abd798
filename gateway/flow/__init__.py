"""Flow control: how many pages are out, and which replica gets the next one.

One file a concept:
- replica.py: one replica as this process sees it (its hard cap, `Replica.slots`), and the
  replicas with room, ranked;
- replicas.py: what both ways of placing share (pages out, pauses, ejections, the share
  taken afresh); balanced.py: behind one load balancer; listed.py: a list or a DNS name;
- health.py: the background probes, and telling the fleet when this process wakes or goes
  quiet;
- share.py: this process's share of the fleet from the fleet board: the one place that
  decides how many pages are in flight (this process's limit, each document's quota, each
  replica's target);
- lead.py: a document that got ahead gives its lead back; reserve.py: workers kept idle for
  images when pages are long;
- queue.py: the fair page queue (documents, priorities); demand.py: this process's demand
  told to the fleet; settle.py: what each answer comes to (retries, failures)."""

from .balanced import BalancedReplicas
from .health import HealthLoop
from .listed import DnsReplicas, ListedReplicas
from .replica import NoReplicas, Replica
from .replicas import LimitSettings, Probe, ReplicaSet, Room

PLACEMENTS = {kind.mode: kind for kind in (BalancedReplicas, ListedReplicas, DnsReplicas)}

__all__ = ["BalancedReplicas", "DnsReplicas", "HealthLoop", "LimitSettings", "ListedReplicas",
           "NoReplicas", "PLACEMENTS", "Probe", "Replica", "ReplicaSet", "Room"]
