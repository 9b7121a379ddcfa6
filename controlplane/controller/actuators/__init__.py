"""Actuators: how the controller starts and stops control function instances.

One interface (``Actuator``), two implementations:

* ``LocalProcessActuator`` (``local``, the embedded default used by
  ``galaxy up``): each instance is a ``galaxy serve KIND`` child process of
  the controller, tied to it by a lifeline pipe;
* ``KubernetesActuator`` (``kubernetes``): each kind is a Deployment whose
  replica count is set through the scale subresource.
"""

from controlplane.controller.actuators.base import Actuator, ActuatorError, NoActuator

__all__ = ["Actuator", "ActuatorError", "NoActuator"]
