"""The closed loop: measure a machine, fit the cost model's figures, check predictions, refit.

- `measure`, `measure_collectives`, `timing`: microbenchmarks of this machine (`exaplan calibrate`);
- `fit_measurements`: microbenchmarks -> a machine model's figures;
- `published`, `published_files`, `published_schema`: the published training runs, one YAML
  file per source in calibration/data/published/, loaded and validated against their schema;
- `fit_published`, `validate_published` (with `validate_rows`, `validate_tables`): the fit of
  the per-device-kind and per-framework figures to them, and `exaplan validate --published`;
- `validate_local` (with `validate_local_layouts`, `validate_local_summary`), `validate_local_report`, `fit_runs`: layouts run on this machine through
  `exaplan run` against their predictions (`exaplan validate --local`), and the refit of the
  local figures from such runs (`exaplan calibrate --from-runs`);
- `fit_files`: writing a fit into machine_models/ (device_kinds.yaml, frameworks.yaml,
  uncertainty.yaml). The codec of the fitted figures is planner/schema/figures.py (the
  planner's ranking-robustness draws use it too).

May import planner/, runtime/ and machine_models/; only the command line imports it.
"""
