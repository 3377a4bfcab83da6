"""Part: control. The fleet control plane over MQTT: signed probe commands, agent presence, progress and results."""
