"""Launching jobs: ddlrun and what it stands on.

    run.py          ddlrun: the command line, the plan, the job (ddl_core.runner.run:main)
    launcher.py     launch plans for mpirun, srun and the emulated cluster (hosts, slots, env)
    launchcheck.py  a plan's settings checked before anything starts
    exitreport.py   each rank's wrapper: its real exit status back to ddlrun (run as a file)
    tfconfig.py     TF_CONFIG per rank for TensorFlow's MultiWorkerMirroredStrategy (run as a file)
    slurmalloc.py   reading a Slurm allocation (SLURM_* variables, host lists)
    cluster.py      the emulated cluster, hosts in network namespaces
                    (python -m ddl_core.runner.cluster)
    slurmcluster.py Slurm daemons on the emulated cluster

Nothing in the library (comm, settings, model, the framework layers) imports this
package; it imports them. Kept light: importing it loads nothing, and exitreport.py and
tfconfig.py import nothing from it, so they run as plain files inside a rank.
"""
