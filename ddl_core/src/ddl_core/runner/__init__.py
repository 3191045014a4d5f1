"""Launching jobs: ddlrun and what it stands on, in one-way order (each imports only
the ones below it):

    run.py          ddlrun: the command line, the plan, the job (ddl_core.runner.run:main)
    elastic.py      --elastic: its bounds, the survivors' status, the lost ranks named
    discovery.py    --host-discovery-script polled, and the host-update channel to the ranks
    launchcheck.py  a plan's settings checked before anything starts
    tfconfig.py     TF_CONFIG per rank for TensorFlow's MultiWorkerMirroredStrategy (run as a file)
    launcher.py     a plan as an mpirun, srun or jsrun argv
    probe.py        the host check: each host reached as mpirun will reach it (ssh or
                    --launch-agent), its GPUs and CPUs
    plan.py         the launch plan and its placement (consecutive ranks share a host)
    slurmalloc.py   reading a Slurm allocation (SLURM_* variables, host lists)
    hosts.py        host names, -H lists and hostfiles, LaunchError
    exitreport.py   each rank's wrapper: its real exit status back to ddlrun (run as a file)
    child.py        a child process that Ctrl-C reaches

Nothing in the library (comm, settings, model, the framework layers) imports this
package; it imports them. Kept light: importing it loads nothing, and exitreport.py and
tfconfig.py import nothing from it at their top, so they run as plain files inside a rank.
The ranks' side of the host-update channel is ddl_core.hostupdates (outside this package).
The emulated cluster the repository's tests launch on is not here: it is the tools/
distribution (ddl_tools.cluster), which reaches its hosts through --launch-agent.
"""
