"""What of a rendered overlay `podman kube play` can run, rewritten for a machine without a
cluster: `make kube-play` and tests/test_kube_play.py use it.

kube play runs Pods and Deployments (one pod each here: the manifests leave `replicas` to the
HPA) and reads the ConfigMaps their `envFrom` names from the same file. Everything else a render
holds (Namespace, Services, HPAs, PDBs, NetworkPolicy) it does not understand, so it is left
out here and stays checked statically only (deploy/k8s/README.md says which). The rewrites, and
nothing else of the manifests is changed:
- images: the overlay's registry names become the local tags `make images` built;
- the headless Service's DNS name the gateway resolves (GATEWAY_REPLICA_DNS) becomes a
  `hostAliases` entry of the gateway pod, with the worker pods' addresses (no cluster DNS);
- for podman 4.3's kube play: each container port gets a hostPort on 127.0.0.1 (it would
  otherwise publish every containerPort on 0.0.0.0 of the host), and each volume a name
  prefixed with its Deployment's (it names emptyDir volumes machine-wide, so two pods with a
  `tmp` volume would share one)."""

from __future__ import annotations

import copy

PLAYED_KINDS = ("ConfigMap", "Deployment")

# The overlays' image names (without tag) -> the tags `make images` builds.
LOCAL_IMAGES = {
    "ocrfleet/worker-cpu": "localhost/ocrfleet-worker-cpu:dev",
    "ocrfleet/gateway": "localhost/ocrfleet-gateway:dev",
}


def kind_name(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def image_repository(image: str) -> str:
    """`reg/name:tag` or `name@sha256:...` -> `reg/name` (a port's colon is kept)."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    return image[: len(image) - len(last)] + last.split(":", 1)[0]


def local_image(image: str, images: dict[str, str] = LOCAL_IMAGES) -> str:
    repository = image_repository(image)
    if repository not in images:
        raise ValueError(f"no local tag for image {image!r} (known: {', '.join(images)})")
    return images[repository]


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def configmaps_used(deployment: dict) -> set[str]:
    spec = pod_spec(deployment)
    names = set()
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        names |= {source["configMapRef"]["name"] for source in container.get("envFrom", [])
                  if "configMapRef" in source}
        names |= {item["valueFrom"]["configMapKeyRef"]["name"]
                  for item in container.get("env", [])
                  if "configMapKeyRef" in item.get("valueFrom", {})}
    return names


def playable(objects: list[dict], deployments: tuple[str, ...],
             images: dict[str, str] = LOCAL_IMAGES) -> tuple[list[dict], list[str]]:
    """(objects kube play gets, `Kind/name` of what was left out): the named Deployments, with
    their images pointed at local tags, and the ConfigMaps they read. A named Deployment
    missing from the render, or one reading a ConfigMap the render lacks, is an error."""
    by_name = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    missing = [name for name in deployments if name not in by_name]
    if missing:
        raise ValueError(f"the render has no Deployment {', '.join(missing)}")
    kept = []
    needed: set[str] = set()
    for name in deployments:
        deployment = copy.deepcopy(by_name[name])
        spec = pod_spec(deployment)
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            container["image"] = local_image(container["image"], images)
        needed |= configmaps_used(deployment)
        kept.append(deployment)
    configmaps = [o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] in needed]
    absent = needed - {o["metadata"]["name"] for o in configmaps}
    if absent:
        raise ValueError(f"ConfigMap {', '.join(sorted(absent))} is not in the render")
    played = {id(o) for o in configmaps}
    left_out = [kind_name(o) for o in objects
                if id(o) not in played and not (o["kind"] == "Deployment"
                                                and o["metadata"]["name"] in deployments)]
    return copy.deepcopy(configmaps) + kept, left_out


def config_value(objects: list[dict], configmap_prefix: str, key: str) -> str:
    """A key of the (hash-suffixed) ConfigMap whose name starts with the prefix."""
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith(configmap_prefix):
            if key in obj.get("data", {}):
                return obj["data"][key]
    raise KeyError(f"{key} in ConfigMap {configmap_prefix}*")


def dns_host(replica_dns: str) -> str:
    """`name:port` (GATEWAY_REPLICA_DNS) -> name."""
    host, _, port = replica_dns.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {replica_dns!r}")
    return host


def with_host_aliases(deployment: dict, hostname: str, addresses: list[str]) -> dict:
    """The Deployment with `hostname` resolving to every address in its pods (/etc/hosts), as
    the headless Service's DNS name resolves to every Ready worker pod in a cluster."""
    if not addresses:
        raise ValueError("no address for the host alias")
    result = copy.deepcopy(deployment)
    aliases = pod_spec(result).setdefault("hostAliases", [])
    aliases += [{"ip": address, "hostnames": [hostname]} for address in addresses]
    return result


def for_podman(deployment: dict, host_ports: dict[int, int]) -> tuple[dict, list[str]]:
    """(the Deployment with its container ports bound to the given loopback host ports and its
    volumes renamed `<deployment>-<volume>`, the new volume names to remove afterwards)."""
    result = copy.deepcopy(deployment)
    spec = pod_spec(result)
    prefix = result["metadata"]["name"]
    renamed = {v["name"]: f"{prefix}-{v['name']}" for v in spec.get("volumes", [])}
    for volume in spec.get("volumes", []):
        volume["name"] = renamed[volume["name"]]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed[mount["name"]]
        for port in container.get("ports", []):
            if port["containerPort"] not in host_ports:
                raise ValueError(f"no host port for containerPort {port['containerPort']}")
            port["hostPort"] = host_ports[port["containerPort"]]
            port["hostIP"] = "127.0.0.1"
    return result, list(renamed.values())


def container_ports(deployment: dict) -> list[int]:
    spec = pod_spec(deployment)
    return [port["containerPort"] for container in spec.get("containers", [])
            for port in container.get("ports", [])]
