"""The schema: what the planner, the runtime and any other backend agree on.

- `specs`: the three inputs and the framework profile, gathered from one file each: `model_spec`
  (ModelSpec), `machine` (MachineModel, Precision), `job` (TrainingJob), `framework`
  (FrameworkProfile and the layout enums), with `bounds` (the physical bounds, `Spec`) and
  `integers` (divisors);
- `plan`: the plan file (Plan), its enums (Sharding, Recompute, Schedule), reading and writing;
- `vocab`: the protein vocabulary;
- `errors`: PlanError, the one error the command line turns into a message and exit code 2;
- `figures`: the codec between a machine model and the figures that calibration fits.

These modules import nothing from the rest of exaplan; the runtime and the machine models
import nothing else from the planner.
"""
