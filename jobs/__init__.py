"""Ray job entry points, one module per job kind: `python -m jobs.<kind> --config FILE [--set k=v]`.

They are what `albert-dist submit`, the cluster launcher and KubeRay `RayJob`s run on a cluster.
"""
