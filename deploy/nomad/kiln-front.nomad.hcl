# Kiln fronts: stateless `kiln serve --role front` processes (a service job)
# that place creates on nodes and proxy every sandbox request to its node.
# Put a load balancer (and the wildcard DNS name of the sandbox domain) in
# front of them. README.md beside this file says how to run it.
#
#   nomad job run -var store=postgres://… -var cluster_token=… kiln-front.nomad.hcl

variable "kiln" {
  type        = string
  default     = "/usr/local/bin/kiln"
  description = "Path of the kiln binary on each client."
}

variable "store" {
  type        = string
  description = "The catalog: a postgres:// URL every node and front shares."
}

variable "cluster_token" {
  type        = string
  description = "The shared secret between fronts and nodes (at least 32 characters)."
}

variable "count" {
  type    = number
  default = 2
}

variable "port" {
  type        = number
  default     = 8420
  description = "The fronts' listening port; 0: a dynamic port (find it with the kiln-front service)."
}

variable "data_dir" {
  type        = string
  default     = "/var/lib/kiln/front"
  description = "A front keeps nothing there but must have one."
}

variable "heartbeat_interval" {
  type    = string
  default = "2s"
}

variable "node_lost_after" {
  type    = number
  default = 5
}

variable "node_pool" {
  type    = string
  default = "default"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

job "kiln-front" {
  type        = "service"
  node_pool   = var.node_pool
  datacenters = var.datacenters

  update {
    max_parallel     = 1
    min_healthy_time = "5s"
    healthy_deadline = "2m"
    auto_revert      = true
  }

  group "front" {
    count = var.count

    network {
      port "http" {
        static = var.port
      }
    }

    # Nomad's own service catalog (no Consul): load balancers and tests
    # find the fronts as the service kiln-front.
    service {
      name     = "kiln-front"
      provider = "nomad"
      port     = "http"

      check {
        type     = "http"
        path     = "/healthz"
        interval = "5s"
        timeout  = "2s"
      }
    }

    # Two fronts on one host would want the same port.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    task "kiln" {
      # A front needs no root; raw_exec keeps it to the one kiln binary
      # the nodes use.
      driver = "raw_exec"

      config {
        command = var.kiln
        args    = ["serve"]
      }

      env {
        KILN_ROLE               = "front"
        KILN_STORE              = var.store
        KILN_CLUSTER_TOKEN      = var.cluster_token
        KILN_NODE_NAME          = "front-${NOMAD_ALLOC_INDEX}"
        KILN_LISTEN             = "${NOMAD_ADDR_http}"
        KILN_DATA_DIR           = "${var.data_dir}-${NOMAD_ALLOC_INDEX}"
        KILN_HEARTBEAT_INTERVAL = var.heartbeat_interval
        KILN_NODE_LOST_AFTER    = var.node_lost_after
      }

      kill_signal  = "SIGTERM"
      kill_timeout = "20s"

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
