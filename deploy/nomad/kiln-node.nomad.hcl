# Kiln nodes: one `kiln serve --role node` on every Nomad client of the node
# pool (a system job), holding that host's sandboxes. Fronts find nodes
# through the catalog, not through Nomad: a node registers its advertise URL
# there and heartbeats. README.md beside this file says how to run it.
#
#   nomad job run -var store=postgres://… -var cluster_token=… kiln-node.nomad.hcl

variable "kiln" {
  type        = string
  default     = "/usr/local/bin/kiln"
  description = "Path of the kiln binary on each client; kiln-agent must be next to it."
}

variable "store" {
  type        = string
  description = "The catalog: a postgres:// URL every node and front shares."
}

variable "cluster_token" {
  type        = string
  description = "The shared secret between fronts and nodes (at least 32 characters)."
}

variable "data_dir" {
  type        = string
  default     = "/var/lib/kiln"
  description = "Templates, sandboxes, agent cache. May hold $${node.unique.name} (Nomad fills it in per client)."
}

variable "run_dir" {
  type        = string
  default     = "/run/kiln"
  description = "Runtime state roots (runsc, runc). May hold $${node.unique.name}."
}

variable "runtime" {
  type        = string
  default     = "runsc"
  description = "Default runtime of sandboxes whose create names none: runsc or runc."
}

variable "network" {
  type        = string
  default     = "auto"
  description = "Sandbox networking on the host: auto, on or off (KILN_NETWORK)."
}

variable "domain" {
  type        = string
  default     = ""
  description = "The fronts' public sandbox domain (E2B <port>-<id>.<domain> URLs); empty: none."
}

variable "node_slots" {
  type    = number
  default = 256
}

variable "heartbeat_interval" {
  type    = string
  default = "2s"
}

variable "node_lost_after" {
  type    = number
  default = 5
}

variable "drain_timeout" {
  type        = string
  default     = "30s"
  description = "How long a stopping node waits, draining, for its sandboxes to end (KILN_DRAIN_TIMEOUT); keep kill_timeout above it."
}

variable "node_pool" {
  type        = string
  default     = "default"
  description = "The Nomad node pool of the sandbox hosts."
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

job "kiln-node" {
  type        = "system"
  node_pool   = var.node_pool
  datacenters = var.datacenters

  group "node" {
    network {
      # Dynamic: fronts learn each node's address from the catalog.
      port "http" {}
    }

    restart {
      attempts = 10
      interval = "10m"
      delay    = "5s"
      mode     = "delay"
    }

    task "kiln" {
      # raw_exec as the client's user (root): a node creates namespaces,
      # mounts and cgroups, and runs runsc/runc itself.
      driver = "raw_exec"

      config {
        command = var.kiln
        args    = ["serve"]
      }

      env {
        KILN_ROLE               = "node"
        KILN_STORE              = var.store
        KILN_CLUSTER_TOKEN      = var.cluster_token
        KILN_NODE_NAME          = "${node.unique.name}"
        KILN_LISTEN             = "${NOMAD_ADDR_http}"
        KILN_ADVERTISE_URL      = "http://${NOMAD_ADDR_http}"
        KILN_DATA_DIR           = var.data_dir
        KILN_RUN_DIR            = var.run_dir
        KILN_RUNTIME            = var.runtime
        KILN_NETWORK            = var.network
        KILN_DOMAIN             = var.domain
        KILN_NODE_SLOTS         = var.node_slots
        KILN_HEARTBEAT_INTERVAL = var.heartbeat_interval
        KILN_NODE_LOST_AFTER    = var.node_lost_after
        KILN_DRAIN_TIMEOUT      = var.drain_timeout
      }

      # SIGTERM: the node drains (marked draining, new creates go to other
      # nodes) for up to drain_timeout while its sandboxes end, then takes
      # kiln's own shutdown grace (10 s) for in-flight requests and
      # streams. kill_timeout must exceed both together (and the client's
      # max_kill_timeout, 30 s by default, caps it: raise that too).
      # Sandboxes left run in cgroups of their own and outlive the
      # process: a node back within the lost window re-adopts them
      # (README.md, "Restarts and draining").
      kill_signal  = "SIGTERM"
      kill_timeout = "45s"

      resources {
        # What the kiln process itself needs; sandboxes are accounted by
        # Kiln (--node-slots, memory limits), not by Nomad.
        cpu    = 200
        memory = 256
      }
    }
  }
}
