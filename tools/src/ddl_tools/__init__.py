"""What only this repository's tests and benchmarks use; never installed into a user's env.

    cluster.py       an emulated multi-host cluster: network namespaces, shaped links, and
                     the launch agent ddlrun reaches them with (python -m ddl_tools.cluster)
    slurmcluster.py  Slurm's daemons on that cluster (munged, slurmctld, a slurmd per host)
    clusterbench.py  DDL's allreduce against MPI's on that cluster
                     (python -m ddl_tools.clusterbench)
    metafs.py        the emulated shared filesystem: a FUSE passthrough with one metadata
                     server at a fixed latency (tools/metafs/metafs.c, built on demand)

It stands on ddl_core (ddlrun, the cost model, the benchmarks' shared helpers) and
ddl_core never imports it: the launcher takes the cluster the way it takes a site's
hosts, through --launch-agent and --mpi-args.
"""
