"""Router training job: learns per-mode success probabilities from stored forced-mode outcomes
and writes a versioned router artefact registered in the store's checkpoint registry.

    gearshift router train --config router.toml
    gearshift router publish router-20261129-101500-ab12cd
"""
