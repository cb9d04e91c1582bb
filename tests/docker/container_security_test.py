#!/usr/bin/env python3
"""The container runs kcache with least privilege (issue 26).

The image cannot be built on these machines (no Docker engine), so this reads
docker/compose.yaml and docker/Dockerfile and checks what they ask for:

Dockerfile (runtime stage, the last FROM):
  - creates the kcache user and group with a fixed uid/gid (useradd/groupadd);
  - ends with a numeric, non-root USER that is that user;
  - declares the store and socket directories as its VOLUMEs.
compose.yaml, every service that runs the kcache image:
  - user: that same uid:gid (never root);
  - read_only: true; cap_drop: [ALL] and no cap_add; security_opt
    no-new-privileges:true; not privileged; no host pid/ipc/network;
  - writable mounts (volumes not :ro, tmpfs) only where allowed: the store
    (/var/lib/kcache) and the socket directory (/run/kcache); the CI warm
    job instead its /work and a tmpfs /tmp.

It also checks that it can fail: broken copies of both files are refused,
each naming the service and the setting.

usage: container_security_test.py COMPOSE_YAML DOCKERFILE
"""
import copy
import re
import sys
import unittest

import yaml

STORE = "/var/lib/kcache"
SOCKET_DIR = "/run/kcache"
# Writable paths per service; any other kcache service gets DAEMON_WRITABLE.
DAEMON_WRITABLE = {STORE, SOCKET_DIR}
WRITABLE = {"warm": {"/work", "/tmp"}}
KCACHE_IMAGE = "kcache:latest"


def runtime_stage(dockerfile_text):
    """The lines of the last stage, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", dockerfile_text)
    lines = [l.strip() for l in joined.splitlines()]
    lines = [l for l in lines if l and not l.startswith("#")]
    last_from = max(i for i, l in enumerate(lines) if l.upper().startswith("FROM "))
    return lines[last_from:]


def check_dockerfile(text):
    """Returns (problems, "uid:gid" of the user the image runs as)."""
    problems = []
    stage = runtime_stage(text)
    uid = gid = None
    for l in stage:
        if l.upper().startswith("RUN "):
            m = re.search(r"useradd\b[^&;]*--uid\s+(\d+)", l)
            if m:
                uid = m.group(1)
            m = re.search(r"groupadd\b[^&;]*--gid\s+(\d+)", l)
            if m:
                gid = m.group(1)
    if uid is None or gid is None:
        problems.append("Dockerfile: the runtime stage creates no user and group "
                        "with a fixed uid/gid (useradd --uid, groupadd --gid)")
    users = [l.split(None, 1)[1].strip() for l in stage if l.upper().startswith("USER ")]
    if not users:
        problems.append("Dockerfile: the runtime stage has no USER: it runs as root")
        return problems, None
    user = users[-1]
    if not re.fullmatch(r"\d+:\d+", user):
        problems.append(f"Dockerfile: USER {user}: give the numeric uid:gid, so that "
                        "a runtime can tell it is not root")
    elif user.split(":")[0] == "0" or user.split(":")[1] == "0":
        problems.append(f"Dockerfile: USER {user} is root")
    elif uid is not None and user != f"{uid}:{gid}":
        problems.append(f"Dockerfile: USER {user} is not the user it creates ({uid}:{gid})")
    volumes = " ".join(l for l in stage if l.upper().startswith("VOLUME "))
    for path in (STORE, SOCKET_DIR):
        if path not in volumes:
            problems.append(f"Dockerfile: {path} is not a VOLUME of the runtime stage")
    return problems, user


def mount_target(volume):
    """(target, writable) of one compose volume entry."""
    if isinstance(volume, dict):
        return volume.get("target"), not volume.get("read_only", False)
    parts = volume.split(":")
    if len(parts) == 1:
        return parts[0], True  # anonymous volume
    mode = parts[2] if len(parts) > 2 else "rw"
    return parts[1], "ro" not in mode.split(",")


def check_compose(doc, image_user):
    problems = []
    services = doc.get("services") or {}
    kcache = {name: s for name, s in services.items()
              if s.get("image") == KCACHE_IMAGE or "build" in s}
    if not kcache:
        problems.append("compose.yaml: no service runs the kcache image")
    for name, s in sorted(kcache.items()):
        def bad(what):
            problems.append(f"compose.yaml: service {name}: {what}")
        user = str(s.get("user", ""))
        if not user:
            bad("no user: (give the image's uid:gid)")
        elif user.split(":")[0] in ("0", "root"):
            bad(f"user {user} is root")
        elif image_user is not None and user != image_user:
            bad(f"user {user} is not the image's user {image_user}")
        if s.get("read_only") is not True:
            bad("read_only: true missing (read-only root file system)")
        if "ALL" not in [str(c).upper() for c in s.get("cap_drop") or []]:
            bad("cap_drop: [ALL] missing")
        if s.get("cap_add"):
            bad(f"cap_add {s['cap_add']}: no capability is needed")
        opts = [str(o).replace("=", ":").replace(" ", "") for o in s.get("security_opt") or []]
        if "no-new-privileges:true" not in opts and "no-new-privileges" not in opts:
            bad("security_opt no-new-privileges:true missing")
        if s.get("privileged"):
            bad("privileged")
        for key in ("pid", "ipc", "network_mode", "userns_mode"):
            if str(s.get(key, "")) == "host":
                bad(f"{key}: host")
        allowed = WRITABLE.get(name, DAEMON_WRITABLE)
        writable = []
        for v in s.get("volumes") or []:
            target, rw = mount_target(v)
            if rw:
                writable.append(target)
        tmpfs = s.get("tmpfs") or []
        if isinstance(tmpfs, str):
            tmpfs = [tmpfs]
        writable += [t.split(":")[0] for t in tmpfs]
        for target in writable:
            if target not in allowed:
                bad(f"{target} is writable; only {sorted(allowed)} may be")
    return problems


def check(compose_text, dockerfile_text):
    problems, image_user = check_dockerfile(dockerfile_text)
    problems += check_compose(yaml.safe_load(compose_text), image_user)
    return problems


class ContainerSecurityTest(unittest.TestCase):
    compose_text = ""
    dockerfile_text = ""

    def test_shipped_files_pass(self):
        problems = check(self.compose_text, self.dockerfile_text)
        self.assertEqual(problems, [], "\n".join(problems))

    def test_every_kcache_service_is_checked(self):
        doc = yaml.safe_load(self.compose_text)
        names = {n for n, s in doc["services"].items()
                 if s.get("image") == KCACHE_IMAGE or "build" in s}
        self.assertTrue({"kcached", "warm", "node-a", "node-b"} <= names, names)

    # The checker refuses what it must: one breakage at a time.
    def broken_compose(self, service, mutate):
        doc = yaml.safe_load(self.compose_text)
        # node-b is merged from node-a by YAML; safe_load has expanded it.
        mutate(doc["services"][service])
        _, user = check_dockerfile(self.dockerfile_text)
        return check_compose(doc, user)

    def assertRefused(self, problems, *words):
        self.assertTrue(any(all(w in p for w in words) for p in problems),
                        f"no problem naming {words}: {problems}")

    def test_refuses_a_writable_root(self):
        p = self.broken_compose("kcached", lambda s: s.pop("read_only"))
        self.assertRefused(p, "service kcached", "read_only")

    def test_refuses_capabilities(self):
        p = self.broken_compose("node-b", lambda s: s.update(cap_drop=["NET_RAW"]))
        self.assertRefused(p, "service node-b", "cap_drop")
        p = self.broken_compose("kcached", lambda s: s.update(cap_add=["SYS_ADMIN"]))
        self.assertRefused(p, "service kcached", "cap_add")

    def test_refuses_new_privileges_and_root(self):
        p = self.broken_compose("warm", lambda s: s.update(security_opt=[]))
        self.assertRefused(p, "service warm", "no-new-privileges")
        p = self.broken_compose("node-a", lambda s: s.update(user="0:0"))
        self.assertRefused(p, "service node-a", "root")

    def test_refuses_other_writable_paths(self):
        p = self.broken_compose("kcached", lambda s: s["volumes"].append("/srv/data:/data"))
        self.assertRefused(p, "service kcached", "/data is writable")
        p = self.broken_compose("kcached", lambda s: s.update(tmpfs=["/tmp"]))
        self.assertRefused(p, "service kcached", "/tmp is writable")
        # Read-only mounts are fine (the host's CUDA toolkit, for example).
        p = self.broken_compose("kcached",
                                lambda s: s["volumes"].append("/usr/local/cuda:/usr/local/cuda:ro"))
        self.assertEqual(p, [])

    def test_refuses_a_root_image(self):
        text = re.sub(r"^USER .*$", "USER root", self.dockerfile_text, flags=re.M)
        self.assertRefused(check_dockerfile(text)[0], "USER root")
        text = re.sub(r"^USER .*$", "", self.dockerfile_text, flags=re.M)
        self.assertRefused(check_dockerfile(text)[0], "no USER")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        ContainerSecurityTest.compose_text = f.read()
    with open(sys.argv[2]) as f:
        ContainerSecurityTest.dockerfile_text = f.read()
    unittest.main(argv=sys.argv[:1], verbosity=2)
