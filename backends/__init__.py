"""Engines and the Ray machinery that hosts them. Never imports an HTTP framework.

Two packages that barely touch: `engines` (one loaded model behind the `Engine` seam; never imports
Ray) and `cluster` (replica actors, routing, the controller and its deployments; never imports an
engine library). The replica actor is where the two meet: it builds an engine with
`engines.factory.make_engine` and streams its deltas over Ray.
"""
