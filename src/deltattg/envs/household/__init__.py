"""A fast, pure-Python stand-in for ALFWorld: procedurally generated household tasks with an optimal planner.

    env = HouseholdEnv(HouseholdConfig.short())
    task = env.tasks("train")[0]
    observation = env.reset(task)            # "... Your task is to: put a hot apple on countertop."
    result = env.step(env.plan()[0])         # info: won, truncated, valid, admissible, optimal_remaining

**World.** Numbered receptacles ("cabinet 2"; cabinets, drawers, fridges, microwaves and safes open and close), numbered
objects inside them, and one ``desklamp 1`` on a desk, side table, dresser or coffee table. The agent starts in the
middle of the room with empty hands and holds at most one object. Openable receptacles start closed (a knob).

**Commands** (ALFWorld 2.1 wording, so text learned here reads the same there): ``go to R``, ``open R``, ``close R``,
``take O from R``, ``move O to R`` (ALFWorld 2.1's form of "put"), ``clean O with sinkbasin N``, ``heat O with
microwave N``, ``cool O with fridge N``, ``use desklamp 1`` (toggles), ``examine R``, ``examine O`` (held),
``look``, ``inventory``. Taking from or moving into a closed receptacle is not admissible; cleaning, heating and
cooling need only the agent at the appliance with the object in hand. Heating makes an object hot and no longer cool;
cooling does the reverse. Actions match after lower-casing and collapsing whitespace; anything not admissible answers
"Nothing happens." and still costs a step.

**Tasks** (ALFWorld's six types; goals name types, not instances): ``pick_and_place_simple`` (some O in/on any R of a
type), ``pick_clean_then_place_in_recep`` / ``pick_heat_then_place_in_recep`` / ``pick_cool_then_place_in_recep`` (the
placed O must be clean / hot / cool), ``pick_two_obj_and_place`` (two O in the same R) and ``look_at_obj_in_light``
(hold an O next to the lit desklamp). Reward 1 and ``done`` on the step that meets the goal; ``done`` with reward 0 at
``max_steps`` (50 by default, as in ALFWorld).

**Harmful actions** lengthen the optimal remaining plan (``plan_length_change(...) > 0``, ``is_harmful``): putting the
target down anywhere but where it belongs (back where it was, or in the wrong receptacle), taking an object that is
not needed (one hand, so it must be put down again), cooling a hot target of a heat task or heating a cool target of a
cool task, closing a receptacle the plan still has to open, switching the lit lamp off, and walking away from where
the next step has to happen. Progress shortens the plan by exactly 1; everything else (look, inventory, examine, walks
that were needed anyway, invalid commands) leaves it unchanged.

**Splits** ``train`` / ``valid_seen`` / ``valid_unseen`` are fixed task lists from disjoint seeds; valid_unseen poses
only held-out (object, receptacle) goal pairings, which the other two never pose. ``vocabulary(config)`` lists every
word (as ``split_words`` and a whitespace-then-punctuation tokenizer split text) the environment can produce.

Modules: ``catalog`` (kinds of things, task types, text templates), ``world`` (state, commands, transitions, text, goal
test), ``planner`` (optimal plans from any state), ``generation`` (config, seeds, splits, vocabulary), ``env``.
"""

from deltattg.envs.household.catalog import SYSTEM_PROMPT, TASK_TYPES, split_words
from deltattg.envs.household.env import HouseholdEnv, HouseholdSnapshot
from deltattg.envs.household.generation import SPLITS, HouseholdConfig, generate, is_held_out, split_tasks, vocabulary
from deltattg.envs.household.planner import best_route, is_harmful, optimal_remaining, plan, plan_length_change
from deltattg.envs.household.world import (
    Command,
    Goal,
    State,
    World,
    admissible_commands,
    intro_text,
    is_won,
    narrate,
    transition,
)

__all__ = [
    "SPLITS",
    "SYSTEM_PROMPT",
    "TASK_TYPES",
    "Command",
    "Goal",
    "HouseholdConfig",
    "HouseholdEnv",
    "HouseholdSnapshot",
    "State",
    "World",
    "admissible_commands",
    "best_route",
    "generate",
    "intro_text",
    "is_harmful",
    "is_held_out",
    "is_won",
    "narrate",
    "optimal_remaining",
    "plan",
    "plan_length_change",
    "split_tasks",
    "split_words",
    "transition",
    "vocabulary",
]
