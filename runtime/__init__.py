"""exaplan runtime: executes a plan file with torch.distributed, one process per rank.

The trainer core: launch.py (starting the ranks), mesh.py (the device mesh), model.py (the
protein LM), parallel/ (tensor, context, pipeline and data parallelism, recompute), loader.py
(the data-parallel loader over prepared shards), checkpoint/ (layout-independent checkpoints),
metrics.py (measured against predicted), options.py (the options of a run), trainer.py (a
plan's steps, in order), build.py (joining the process group, building and parallelising the
model), pretrain.py (the pretraining task), dpo.py, dpo_objective.py, dpo_pairs.py and
dpo_eval.py (preference optimisation, its loss, its pairs and its evaluation). Data preparation (FASTA -> token
shards, preference pairs, `exaplan data`) is apart, in dataprep/, which imports nothing from
the rest of the runtime.

From the planner the runtime imports only the plan schema (planner.schema).
"""
