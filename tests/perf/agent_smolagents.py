"""A two-step tool task for an agent framework against `specchat serve`: smolagents' ToolCallingAgent
(OpenAI tool calls, tool_choice required at every step) asks for the weather, converts it, answers.
Not a test: it needs smolagents, in a venv of its own (`pip install smolagents openai`), and a
running server:

    specchat serve qwen2.5-coder-1.5b --port 8091 &
    python tests/perf/agent_smolagents.py --url http://127.0.0.1:8091/v1

Prints each step's call and observation and exits 0 when the final answer is the right conversion.
"""

from __future__ import annotations

import argparse
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

CELSIUS = 17
TASK = (
    "What is the temperature in Paris right now, in degrees Fahrenheit? "
    "First get the weather, then convert it."
)


@tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city's name, e.g. Paris
    """
    return f"{city}: {CELSIUS} degrees Celsius, light rain"


@tool
def celsius_to_fahrenheit(celsius: float) -> float:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: the temperature in degrees Celsius
    """
    return celsius * 9 / 5 + 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8091/v1")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    model = OpenAIServerModel(model_id="specchat", api_base=args.url, api_key="none", temperature=0)
    agent = ToolCallingAgent(tools=[get_weather, celsius_to_fahrenheit], model=model, max_steps=args.steps)
    answer = agent.run(TASK)
    for step in agent.memory.steps:
        for call in getattr(step, "tool_calls", None) or ():
            seen = getattr(step, "observations", "")
            print(f"step {step.step_number}: {call.name}({call.arguments}) -> {seen}")
    want = str(CELSIUS * 9 / 5 + 32)
    print(f"final answer: {answer!r} ({'right' if want in str(answer) else 'wrong'}: {want})")
    return 0 if want in str(answer) else 1


if __name__ == "__main__":
    sys.exit(main())
