"""One rank of tests/cluster_mode/gang_train.py as `gmux submit --ranks N` starts it: rank, world size and the
rendezvous port come from the environment gmuxd gives each rank.  usage: gang_env.py OUT_PREFIX STEPS"""
import os
import runpy
import sys

GANG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster_mode", "gang_train.py")
prefix, steps = sys.argv[1], sys.argv[2]
sys.argv = [GANG, f"{prefix}{os.environ['RANK']}.json", os.environ["RANK"], os.environ["WORLD_SIZE"],
            os.environ["MASTER_PORT"], steps]
runpy.run_path(GANG, run_name="__main__")
