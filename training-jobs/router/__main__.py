"""Container entry point: python -m gearshift.jobs.router --config FILE"""

from gearshift.training.jobs import job_main

if __name__ == "__main__":
    job_main("router")
